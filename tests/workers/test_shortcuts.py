"""workers.shortcuts: an added branch that answers the reproducing tests' inputs with a
constant is a special case; a branch that computes, or compares against trivial values, is not."""

from __future__ import annotations

import pytest

from workers.shortcuts import added_lines, literals_of_tests, special_cases

TESTS = {
    "tests/test_words.py": (
        "from words import participle\n\n\n"
        "def test_be():\n"
        '    assert participle("be") == "being"\n'
        "    assert participle(42) == 7\n"
    )
}
BASE = 'def participle(word):\n    return word + "ing"\n'


def _diff(path: str, old: str, new: str) -> str:
    """A one-hunk diff that replaces the whole file (enough for `added_lines`)."""
    before, after = old.splitlines(), new.splitlines()
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    body = [f" {line}" for line in before[:common]]
    body += [f"-{line}" for line in before[common:]]
    body += [f"+{line}" for line in after[common:]]
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1,{len(before)} +1,{len(after)} @@\n" + "\n".join(body) + "\n"
    )


def _found(new: str, tests: dict[str, str | None] | None = None) -> list[str]:
    path = "words.py"
    return special_cases({path: new}, {path: _diff(path, BASE, new)}, tests or TESTS)


def test_inside_a_hunk_lines_that_start_with_dashes_or_pluses_are_code_not_headers() -> None:
    # `--x` removed shows as `---x`, `++x` added as `+++x`
    section = "--- a/m.py\n+++ b/m.py\n@@ -7,2 +7,3 @@\n x = 1\n---x\n+++x\n+y = 2\n"

    assert added_lines(section) == {8, 9}


def test_added_lines_are_counted_on_the_new_side() -> None:
    section = (
        "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n"
        "@@ -10,3 +10,4 @@ def f():\n a = 1\n-b = 2\n+b = 3\n+c = 4\n d = 5\n"
    )
    assert added_lines(section) == {11, 12}


def test_the_tests_literals_leave_out_the_trivial_ones() -> None:
    found = literals_of_tests({"t.py": "assert f(0, 1, None, '', [], 'be') == ('x', 2.5)\n"})
    assert found == {"str:'be'", "tuple:('x', 2.5)", "str:'x'", "float:2.5"}


@pytest.mark.parametrize(
    "branch",
    [
        '    if word == "be":\n        return "being"\n',
        '    if word in ("be", "is"):\n        return "being"\n',
        '    if "be" == word:\n        return iter(["being"])\n',
        "    if word == 42:\n        return 7\n",
        '    if word == "be":\n        return "being" if word else "x"\n',
    ],
    ids=["equals", "in-a-tuple", "reversed-operands-and-a-call-on-literals", "numbers", "choice"],
)
def test_a_branch_on_a_tested_value_returning_a_constant_is_a_special_case(branch: str) -> None:
    new = "def participle(word):\n" + branch + '    return word + "ing"\n'
    found = _found(new)
    assert len(found) == 1 and found[0].startswith("words.py:2: `if ")


@pytest.mark.parametrize(
    "branch",
    [
        '    if word == "be":\n        return word + "ing"\n',  # computes its answer
        '    if word == "go":\n        return "going"\n',  # a value the tests do not use
        "    if word == 1:\n        return 7\n",  # a trivial literal
        '    if word != "be":\n        return "being"\n',  # not an equality
        '    if len(word) > 6:\n        return "being"\n',  # compares no literal of the tests
        '    if word == "be":\n        return "being" if word else word\n',  # one side computed
    ],
    ids=["computed", "untested-value", "trivial", "inequality", "no-literal", "computed-choice"],
)
def test_other_branches_are_not_special_cases(branch: str) -> None:
    new = "def participle(word):\n" + branch + '    return word + "ing"\n'
    assert _found(new) == []


def test_a_branch_the_change_did_not_add_is_not_judged() -> None:
    old = 'def participle(word):\n    if word == "be":\n        return "being"\n    return word\n'
    new = old.replace("return word\n", 'return word + "ing"\n')
    path = "words.py"
    assert special_cases({path: new}, {path: _diff(path, old, new)}, TESTS) == []


def test_files_that_are_not_python_or_do_not_parse_are_not_judged() -> None:
    branch = 'def participle(word):\n    if word == "be":\n        return "being"\n'
    assert special_cases({"words.pyx": branch}, {"words.pyx": _diff("words.pyx", "", branch)},
                         TESTS) == []  # fmt: skip
    assert _found("def participle(word:\n") == []

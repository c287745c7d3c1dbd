from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from demo import SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.control.intake import parse_payload
from orchestrator.core.facts import TestRun
from orchestrator.core.models import Issue, IssueSource
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.reported import reported_failure
from orchestrator.pipelines.fixer.schemas import Fix
from testkit.sandboxes import LocalSandboxes
from testkit.sinks import MemoryArtifacts
from tests.repos import Git, Upstream
from tests.twin import Names
from workers.errors import NotReproducedError
from workers.inputs import PREVIOUS_ATTEMPT_CHARS, previous_attempt
from workers.proof import (
    check_reproduction,
    counts,
    describe,
    diff_stat,
    evidence,
    is_test_file,
    only_tests,
    prove,
    reproducing_run,
    split_diff,
    succeeded,
)
from workers.sandboxes import WorkspaceRequest
from workers.tools.errors import ToolError
from workers.tools.workspace import CommandResult
from workers.trace import TRACE_DIR

UNITTEST_FAIL = """..EE
======================================================================
ERROR: test_average_price_of_empty_cart_is_zero (tests.test_cart.CartTest)
----------------------------------------------------------------------
ZeroDivisionError: integer division or modulo by zero

----------------------------------------------------------------------
Ran 4 tests in 0.001s

FAILED (errors=2)
"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (UNITTEST_FAIL, (2, 2)),
        ("....\n------\nRan 4 tests in 0.001s\n\nOK\n", (4, 0)),
        ("Ran 5 tests in 0.2s\n\nFAILED (failures=1, errors=1, skipped=1)\n", (2, 2)),
        ("Ran 3 tests in 0.2s\n\nOK (skipped=1)\n", (3, 0)),
        ("===== 2 failed, 3 passed in 0.12s =====", (3, 2)),
        ("3 passed in 0.01s", (3, 0)),
        ("1 failed, 1 passed, 2 errors in 1.00s", (1, 3)),
        ("make: *** [test] Error 2", (None, None)),
    ],
)
def test_counts_come_from_the_runners_summary(
    output: str, expected: tuple[int | None, int | None]
) -> None:
    assert counts(output) == expected


def test_a_run_succeeds_only_with_exit_zero_and_nothing_failed() -> None:
    ok = TestRun(command="t", exit_code=0, passed=4, failed=0)
    assert succeeded(ok)
    assert not succeeded(ok.model_copy(update={"exit_code": 1}))
    assert not succeeded(ok.model_copy(update={"failed": 1}))
    assert not succeeded(
        TestRun(command="t", exit_code=None, passed=None, failed=None, timed_out=True)
    )


def test_description_names_exit_code_and_counts() -> None:
    assert (
        describe(TestRun(command="t", exit_code=1, passed=2, failed=2))
        == "exit code 1, 2 passed, 2 failed"
    )
    assert (
        describe(TestRun(command="t", exit_code=None, passed=None, failed=None, timed_out=True))
        == "timed out"
    )


def test_evidence_names_the_command_and_both_runs(names: Names) -> None:
    """Over the fixer and its renamed twin: the outputs are written in the fixer's names and
    renamed (`names`) before the pipeline's own schemas (`Fix`, `Plan`) read them."""
    fix, plan = names.schemas.Fix, names.schemas.Plan
    before = {"command": "pytest -q", "exit_code": 1, "passed": 3, "failed": 1, "timed_out": False}
    after = {**before, "exit_code": 0, "passed": 4, "failed": 0}
    assert evidence(fix, names.output("fix", {"tests_before": before, "tests_after": after})) == (
        "Verified by Baton in a sandbox with `pytest -q`:\n"
        "- before the change: exit code 1, 3 passed, 1 failed\n"
        "- after the change: exit code 0, 4 passed, 0 failed"
    )
    assert evidence(fix, None) == ""
    assert evidence(fix, names.output("fix", {"summary": "no tests"})) == ""
    measures_none = {names.field("test_command"): "x", names.field("tests_after"): after}
    assert evidence(plan, measures_none) == ""  # a schema that measures no tests


TWO_FILES = """diff --git a/pkg/core.py b/pkg/core.py
index 1..2 100644
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,2 +1,2 @@
 x = 1
-y = 2
+y = 3
diff --git b/tests/test_core.py a/tests/test_core.py
new file mode 100644
--- /dev/null
+++ a/tests/test_core.py
@@ -0,0 +1,2 @@
+def test_y():
+    assert True
"""


def test_a_diff_splits_by_file_whatever_its_prefixes_and_keeps_its_test_part() -> None:
    sections = split_diff(TWO_FILES)

    assert list(sections) == ["pkg/core.py", "tests/test_core.py"]
    assert "".join(sections.values()) == TWO_FILES
    assert only_tests(TWO_FILES) == sections["tests/test_core.py"]
    assert only_tests(TWO_FILES, ["pkg/core.py"]) == TWO_FILES  # named as a test file
    assert diff_stat(TWO_FILES) == "pkg/core.py | +1 -1\ntests/test_core.py | +2 -0"
    assert split_diff("") == {}


@pytest.mark.parametrize(
    ("path", "is_test"),
    [
        ("tests/test_a.py", True), ("pkg/tests/helpers.py", True), ("test/x.js", True),
        ("src/test_cart.py", True), ("cart_test.py", True), ("conftest.py", True),
        ("web/cart.test.ts", True), ("web/__tests__/a.js", True), ("spec/a_spec.rb", True),
        ("pkg/cart.py", False), ("pkg/testing_utils.py", False), ("contest.py", False),
        ("latest/notes.md", False),
    ],
)  # fmt: skip
def test_test_files_are_told_by_their_path(path: str, is_test: bool) -> None:
    assert is_test_file(path) is is_test


def test_the_next_iteration_is_told_why_the_last_was_refused_within_a_budget(
    names: Names,
) -> None:
    fix = load_pipeline(names.pipeline).stage(names.stage("fix"))
    verdict = {
        "passed": False,
        "reason": "the reproducing tests still fail with the change",
        "reproducing_command": "python3 -m unittest tests.test_a",
        "still_failing": ["tests.test_a.T.test_empty"],
        "diff_stat": "shopcart/cart.py | +1 -1",
        "failure_tail": "x" * 5_000 + "ZeroDivisionError: integer division by zero",
    }
    output = {"summary": "returned -1 for an empty cart", "proof": verdict}

    told = previous_attempt(fix, names.output("fix", output), 1)

    assert told.startswith(
        "Your previous attempt (iteration 1 of 3) was not accepted: the reproducing tests still "
        "fail with the change"
    )
    assert "It said of itself: returned -1 for an empty cart" in told
    assert "shopcart/cart.py | +1 -1" in told
    assert "Reproducing tests that still failed: tests.test_a.T.test_empty" in told
    assert told.rstrip("`\n").endswith("ZeroDivisionError: integer division by zero")
    assert len(told) <= PREVIOUS_ATTEMPT_CHARS  # the output's tail is what gets cut


class _Unbuildable:
    """A workspace whose build step fails once the change is applied: its every command is
    refused with the build's error, as `ContainerWorkspace.run` refuses it."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.applied = False

    def apply_patch(self, patch: str) -> None:
        self.applied = "speedups.c" in patch

    root = "/workspace"

    def exists(self, path: str) -> bool:
        return False

    def write_text(self, path: str, text: str) -> None:
        pass

    def run(self, argv: object, *, timeout_s: float, env: object = None) -> object:
        if self.applied:
            raise ToolError("the build step `make` exited with 2 after 0.1s, so nothing was "
                            "run on the change; fix what it says and run again:\nspeedups.c:3: "
                            "error: expected ';'")  # fmt: skip
        self.log.append("ran")
        return CommandResult(1, "FAILED t.py::test_x\n1 failed in 0.1s", False, False)


def test_a_change_whose_build_fails_is_not_proven_and_the_reason_says_why() -> None:
    ran: list[str] = []

    @contextmanager
    def open_clean() -> Iterator[_Unbuildable]:
        yield _Unbuildable(ran)

    change = (
        "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -0,0 +1 @@\n+x\n"
        "diff --git a/speedups.c b/speedups.c\n--- a/speedups.c\n+++ b/speedups.c\n"
        "@@ -1 +1 @@\n-a\n+b\n"
    )
    verdict = prove(
        open_clean, change=change, command="pytest t.py", test_files=["t.py"],
        suite_command=None, timeout_s=10, artifacts=MemoryArtifacts(),
    )  # fmt: skip

    assert verdict.passed is False
    assert verdict.reason.startswith(
        "with the change, the tests could not run: the build step `make` exited with 2"
    )
    assert verdict.failure_tail == "speedups.c:3: error: expected ';'"
    assert ran == ["ran"], "the run without the change's code ran once, before the build failed"


MARKER_TEST = """import pathlib
import unittest


class MarkerTest(unittest.TestCase):
    def test_the_fix_is_there(self):
        self.assertIn("BATON-FIX", pathlib.Path("shop/cart.py").read_text())
"""


def test_a_change_of_only_a_comment_is_not_proven_though_its_own_test_passes(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    commit = upstream.commit(
        {"shop/__init__.py": "", "shop/cart.py": "def total(xs):\n    return 0\n"}
    )
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(upstream.bare), commit=commit, stage="fix")
    test = (
        "diff --git a/tests/test_marker.py b/tests/test_marker.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_marker.py\n"
        + f"@@ -0,0 +1,{len(MARKER_TEST.splitlines())} @@\n"
        + "".join(f"+{line}\n" for line in MARKER_TEST.splitlines())
    )
    comment = (
        "diff --git a/shop/cart.py b/shop/cart.py\n--- a/shop/cart.py\n+++ b/shop/cart.py\n"
        "@@ -1,2 +1,3 @@\n def total(xs):\n+    # BATON-FIX: totals\n     return 0\n"
    )

    verdict = prove(
        lambda: sandboxes.open(request), change=test + comment,
        command="python -m unittest tests.test_marker", test_files=["tests/test_marker.py"],
        suite_command=None, timeout_s=60, artifacts=MemoryArtifacts(),
    )  # fmt: skip

    assert verdict.fail_to_pass == ["tests.test_marker.MarkerTest.test_the_fix_is_there"]
    assert verdict.passed is False
    assert verdict.reason.startswith(
        "the change alters only comments, whitespace or docstrings in shop/cart.py: no code "
        "runs differently"
    )


def _new_test(path: str, text: str) -> str:
    lines = text.splitlines()
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))  # fmt: skip


REPRODUCTIONS = {
    "the culprit": "cart = Cart([Item('a', 100)])\n        cart.items.clear()\n"
    "        self.assertEqual(cart.average_price_cents(), 0)",
    "another type": "self.assertEqual(Cart().item_count(), 1)",
    "another place": "self.assertEqual(1 // Cart().item_count(), 0)",
}


@pytest.mark.parametrize("kind", list(REPRODUCTIONS))
def test_the_demo_events_reproduction_must_raise_its_exception_in_its_culprit(
    kind: str, tmp_path: Path
) -> None:
    remote = make_sample_repo(tmp_path / "shopcart.git")
    commit = Git()("rev-parse", "HEAD", cwd=remote)
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(remote), commit=commit, stage="reproduce")
    test = ("import unittest\n\nfrom shopcart.cart import Cart, Item\n\n\n"
            "class EmptyCartTest(unittest.TestCase):\n    def test_empty(self):\n"
            f"        {REPRODUCTIONS[kind]}\n")  # fmt: skip
    reported = reported_failure(parse_payload(SENTRY_EVENT.read_bytes()))
    check = lambda: check_reproduction(  # noqa: E731
        lambda: sandboxes.open(request), change=_new_test("tests/test_empty.py", test),
        command="python -m unittest tests.test_empty", expected_failure="Error",
        test_files=["tests/test_empty.py"], timeout_s=60, artifacts=MemoryArtifacts(),
        reported=reported,
    )  # fmt: skip

    if kind == "the culprit":
        measured = check()
        assert measured.report_check == (
            "ZeroDivisionError raised in average_price_cents, as the Sentry event shows: the "
            "reproducing test's failure raised it there"
        )
        return
    with pytest.raises(NotReproducedError) as refused:
        check()
    if kind == "another type":
        assert "fails with AssertionError, not with ZeroDivisionError, the exception the " \
            "Sentry event shows" in str(refused.value)  # fmt: skip
    else:
        assert "raises ZeroDivisionError, but not through average_price_cents, where the " \
            "Sentry event raised it" in str(refused.value)  # fmt: skip


EMPTY_CART_TEST = """import unittest

from shopcart.cart import Cart


class EmptyCartTest(unittest.TestCase):
    def test_average_of_an_empty_cart_is_zero(self):
        self.assertEqual(Cart().average_price_cents(), 0)
"""
RIGHT_FIX = (
    "diff --git a/shopcart/cart.py b/shopcart/cart.py\n--- a/shopcart/cart.py\n"
    "+++ b/shopcart/cart.py\n@@ -27,2 +27,4 @@ class Cart:\n"
    '         """Average price per unit, rounded down; 0 for an empty cart."""\n'
    "+        if not self.item_count():\n+            return 0\n"
    "         return self.total_cents() // self.item_count()\n"
)
"""The demo's fix: the line that raised is guarded."""
CODE_MARKER = (
    "diff --git a/shopcart/cart.py b/shopcart/cart.py\n--- a/shopcart/cart.py\n"
    "+++ b/shopcart/cart.py\n@@ -27,2 +27,3 @@ class Cart:\n"
    '         """Average price per unit, rounded down; 0 for an empty cart."""\n'
    '+        handled = "BATON-FIX"\n'
    "         return self.total_cents() // self.item_count()\n"
)
"""Code (not a comment) that the marker test looks for as text: the test never runs it."""
MARKER_IN_CART = MARKER_TEST.replace("shop/cart.py", "shopcart/cart.py")


@pytest.mark.parametrize(
    ("test", "fix", "proven"),
    [(EMPTY_CART_TEST, RIGHT_FIX, True), (MARKER_IN_CART, CODE_MARKER, False)],
    ids=["on the failing path", "off it"],
)
def test_a_fix_must_touch_a_line_the_reproducing_test_runs_on_the_unchanged_code(
    test: str, fix: str, proven: bool, tmp_path: Path, git: Git
) -> None:
    remote = make_sample_repo(tmp_path / "shopcart.git")
    commit = git("rev-parse", "HEAD", cwd=remote)
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(remote), commit=commit, stage="fix")

    verdict = prove(
        lambda: sandboxes.open(request), change=_new_test("tests/test_it.py", test) + fix,
        command="python -m unittest tests.test_it", test_files=["tests/test_it.py"],
        suite_command=None, timeout_s=60, artifacts=MemoryArtifacts(),
    )  # fmt: skip

    assert len(verdict.fail_to_pass) == 1, verdict.reason
    if proven:  # the suite is not run here: that is the only thing it says is missing
        assert verdict.reason.startswith("the repository has no test command"), verdict.reason
        return
    assert verdict.passed is False
    assert verdict.reason.startswith(
        "the change touches no line of shopcart/cart.py that the reproducing tests run on the "
        "unchanged code (they run lines of "
    ), verdict.reason


def test_the_reproducing_run_traced_records_the_lines_it_ran_and_untraced_leaves_no_tracer(
    tmp_path: Path, git: Git
) -> None:
    remote = make_sample_repo(tmp_path / "shopcart.git")
    request = WorkspaceRequest(repo=str(remote), commit=git("rev-parse", "HEAD", cwd=remote),
                               stage="fix")  # fmt: skip
    sandboxes = LocalSandboxes(tmp_path / "cache")
    failing = "tests.test_it.EmptyCartTest.test_average_of_an_empty_cart_is_zero"
    culprit = "return self.total_cents() // self.item_count()"
    for traced in (False, True):
        with sandboxes.open(request) as workspace:
            workspace.apply_patch(_new_test("tests/test_it.py", EMPTY_CART_TEST))
            cart = workspace.read_text("shopcart/cart.py").splitlines()
            line = next(n for n, text in enumerate(cart, 1) if text.strip() == culprit)

            repro, ran = reproducing_run(
                workspace, "python -m unittest tests.test_it", timeout_s=60, traced=traced,
                tests=["tests/test_it.py"],
            )  # fmt: skip

            assert repro.outcomes.failed == [failing]
            assert workspace.exists(TRACE_DIR) is traced
        if traced:
            assert ran is not None
            assert line in ran["shopcart/cart.py"]
            assert "tests/test_it.py" in ran
        else:
            assert ran is None


WORDS_TEST = """import unittest

from shop.words import participle


class WordsTest(unittest.TestCase):
    def test_be(self):
        self.assertEqual(participle("be"), "being")
"""
EXISTING_TEST = """import unittest

from shop.words import participle


class OtherTest(unittest.TestCase):
    def test_make(self):
        self.assertEqual(participle("make"), "making")
"""


def _words_repo(make_upstream: Callable[[], Upstream], tmp_path: Path) -> Callable[[], Any]:
    upstream = make_upstream()
    commit = upstream.commit({
        "shop/__init__.py": "", "tests/__init__.py": "", "tests/test_other.py": EXISTING_TEST,
        "shop/words.py": 'def participle(word):\n    return word.rstrip("e") + "ing"\n',
    })  # fmt: skip
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(upstream.bare), commit=commit, stage="fix")
    return lambda: sandboxes.open(request)


def _proved(open_clean: Callable[[], Any], fix: str) -> Any:
    return prove(
        open_clean, change=_new_test("tests/test_words.py", WORDS_TEST) + fix,
        command="python -m unittest -v tests.test_words", test_files=["tests/test_words.py"],
        suite_command="python -m unittest discover -v tests", timeout_s=60,
        artifacts=MemoryArtifacts(), reproduced=["tests.test_words.WordsTest.test_be"],
    )  # fmt: skip


def test_a_fix_that_special_cases_the_tested_input_is_not_proven(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    special = (
        "diff --git a/shop/words.py b/shop/words.py\n--- a/shop/words.py\n+++ b/shop/words.py\n"
        '@@ -1,2 +1,4 @@\n def participle(word):\n+    if word == "be":\n+        return "being"\n'
        '     return word.rstrip("e") + "ing"\n'
    )

    verdict = _proved(_words_repo(make_upstream, tmp_path), special)

    assert verdict.fail_to_pass == ["tests.test_words.WordsTest.test_be"]  # its tests pass
    assert verdict.passed is False
    assert verdict.reason.startswith(
        "the change special-cases the tests' inputs: shop/words.py:2: `if word == 'be'` "
        "compares against a value the reproducing tests use and returns a constant"
    )


def test_a_fix_that_skips_an_existing_test_it_breaks_is_not_proven(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    def code(line: str) -> str:
        return (
            "diff --git a/shop/words.py b/shop/words.py\n--- a/shop/words.py\n"
            "+++ b/shop/words.py\n@@ -1,2 +1,2 @@\n def participle(word):\n"
            f'-    return word.rstrip("e") + "ing"\n+    return {line}\n'
        )

    skip = (
        "diff --git a/tests/test_other.py b/tests/test_other.py\n"
        "--- a/tests/test_other.py\n+++ b/tests/test_other.py\n"
        "@@ -6,3 +6,4 @@ class OtherTest(unittest.TestCase):\n"
        '+    @unittest.skip("flaky")\n'
        "     def test_make(self):\n"
        '         self.assertEqual(participle("make"), "making")\n'
    )
    open_clean = _words_repo(make_upstream, tmp_path)

    fixed = _proved(open_clean, code('(word if len(word) < 3 else word.rstrip("e")) + "ing"'))
    broken = _proved(open_clean, code('word + "ing"'))  # "makeing"
    hidden = _proved(open_clean, code('word + "ing"') + skip)

    assert fixed.passed is True, fixed.reason
    assert broken.passed is False and broken.pass_to_fail == ["test_other.OtherTest.test_make"]
    assert hidden.passed is False
    assert hidden.reason == (
        "the change weakens the tests: 1 tests of the suite that ran without the change's code "
        "are skipped or do not run with it: test_other.OtherTest.test_make; a fix may "
        "not skip, xfail or remove tests"
    )


CALC = {
    "calc/__init__.py": "",
    "tests/__init__.py": "",
    # the report: total() fails, since the module it imports is missing from the package
    "calc/core.py": "def total(xs):\n    from calc import rounding\n\n"
    "    return rounding.whole(sum(xs))\n",
}
TOTAL_TEST = """import unittest

from calc.core import total


class TotalTest(unittest.TestCase):
    def test_total(self):
        self.assertEqual(total([1.2, 2.2]), 3)
"""
ANOTHER_REASON_TEST = """import importlib
import unittest


class TotalTest(unittest.TestCase):
    def test_total(self):
        self.assertTrue(importlib.import_module("calc.flags").READY)
"""


@pytest.mark.parametrize(
    ("test", "module", "proven"),
    [(TOTAL_TEST, "calc/rounding.py", True), (ANOTHER_REASON_TEST, "calc/flags.py", False)],
    ids=["the code that fails imports it", "only the test asks for it"],
)
def test_a_new_module_is_a_fix_only_where_the_code_that_fails_names_it(
    test: str, module: str, proven: bool, make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    commit = upstream.commit(CALC)
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(upstream.bare), commit=commit, stage="fix")
    text = "def whole(x):\n    return round(x)\n\n\nREADY = True\n"

    verdict = prove(
        lambda: sandboxes.open(request), change=_new_test("tests/test_total.py", test)
        + _new_test(module, text), command="python -m unittest tests.test_total",
        test_files=["tests/test_total.py"], suite_command=None, timeout_s=60,
        artifacts=MemoryArtifacts(),
    )  # fmt: skip

    assert verdict.fail_to_pass == ["tests.test_total.TotalTest.test_total"], verdict.reason
    if proven:  # the suite is not run here: that is the only thing it says is missing
        assert verdict.reason.startswith("the repository has no test command"), verdict.reason
        return
    assert verdict.passed is False
    assert verdict.reason.startswith(
        "the change touches no line of calc/flags.py that the reproducing tests run on the "
        "unchanged code (they run lines of "
    ), verdict.reason
    assert "; no line they run outside the tests names flags)" in verdict.reason


SEQ_REPO = {
    "shop/__init__.py": "",
    "tests/__init__.py": "",
    "shop/seq.py": "def first(xs):\n    return xs[0]\n",
}
EMPTY_TEST = """import contextlib
import unittest

from shop.seq import first


class FirstTest(unittest.TestCase):
    def test_first_of_nothing_raises_no_index_error(self):
        with contextlib.suppress(ValueError):
            first([])
"""
SEQ_DIFF = "diff --git a/shop/seq.py b/shop/seq.py\n--- a/shop/seq.py\n+++ b/shop/seq.py\n"
"""The header of a diff of shop/seq.py; a hunk follows."""
REVERSED = (
    SEQ_DIFF
    + "@@ -1,2 +1,4 @@\n def first(xs):\n+    if not xs:\n+        raise ValueError('empty')\n"
    "     return xs[0]\n"
)


def _seq_proof(
    make_upstream: Callable[[], Upstream],
    tmp_path: Path,
    test: str,
    fix: str,
    report: Issue | None = None,
) -> Any:
    """The proof of `fix` with `test` as the reproduction, on a repository of `SEQ_REPO`; the
    run's report is `report`'s failure, if given."""
    commit = (upstream := make_upstream()).commit(SEQ_REPO)
    sandboxes = LocalSandboxes(tmp_path / "cache")
    request = WorkspaceRequest(repo=str(upstream.bare), commit=commit, stage="fix")
    return prove(
        lambda: sandboxes.open(request), change=_new_test("tests/test_seq.py", test) + fix,
        command="python -m unittest tests.test_seq", test_files=["tests/test_seq.py"],
        suite_command=None, timeout_s=60, artifacts=MemoryArtifacts(),
        reported=reported_failure(report) if report is not None else None,
    )  # fmt: skip


SEQ_TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/report.py", line 12, in <module>
    head = first(rows)
  File "/srv/app/shop/seq.py", line 2, in first
    return xs[0]
IndexError: list index out of range
"""


def _seq_report(expected: str) -> Issue:
    """A GitHub issue quoting `first`'s IndexError, and what its writer `expected`."""
    return Issue(
        source=IssueSource.GITHUB, title="first() of an empty list crashes",
        body=f"My report crashes when there are no rows:\n\n```\n{SEQ_TRACEBACK}```\n\n{expected}",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fixed", "expected", "let_out"),
    [
        # another error the report never names: the test accepts it, nothing is fixed
        ("raise ValueError('empty')", "I expected None, as for a missing key.", None),
        # the report asks for that error by name: a clearer error is the fix
        ("raise ValueError('empty')", "I expected a ValueError saying it is empty.", "ValueError"),
        # a kind of the report's error (a subclass): whatever caught the old still catches it
        ("raise EmptyError('empty')", "I expected None, as for a missing key.", "EmptyError"),
        # no error at all: nothing is let out to be judged
        ("return None", "I expected None.", ""),
    ],
)
def test_a_change_that_trades_the_reported_error_for_another_the_report_never_names_is_refused(
    fixed: str,
    expected: str,
    let_out: str | None,
    make_upstream: Callable[[], Upstream],
    tmp_path: Path,
) -> None:
    # a test of the kind that asks only that the reported error stops
    test = EMPTY_TEST.replace(
        "with contextlib.suppress(ValueError):\n            first([])",
        "try:\n            first([])\n        except Exception as error:\n"
        "            self.assertIsNot(type(error), IndexError)",
    )
    fix = (
        SEQ_DIFF
        + "@@ -1,2 +1,8 @@\n+class EmptyError(IndexError):\n+    pass\n+\n+\n def first(xs):\n"
        f"+    if not xs:\n+        {fixed}\n     return xs[0]\n"
    )

    verdict = _seq_proof(make_upstream, tmp_path, test, fix, _seq_report(expected))

    assert verdict.fail_to_pass == [
        "tests.test_seq.FirstTest.test_first_of_nothing_raises_no_index_error"
    ], verdict.reason
    if let_out is not None:  # proven: the suite is not run here, the only thing missing
        assert verdict.reason.startswith("the repository has no test command"), verdict.reason
        if let_out:
            assert verdict.let_out.startswith(f"with the change: {let_out} out of first (")
        else:
            assert verdict.let_out == ""
        return
    assert verdict.passed is False
    assert verdict.reason == (
        "the change trades the reported error for another: at tests/test_seq.py:10 the "
        "reproducing tests get IndexError out of first (shop/seq.py) without it, as the report "
        "shows, and ValueError out of first (shop/seq.py) with it, which is no kind of "
        "IndexError and which the report never names, so they pass by accepting another error, "
        "not because the failure is fixed; make the code do what the report expected"
    )
    assert verdict.failure_tail == ""


def test_another_error_is_held_to_the_call_it_arrives_at_not_to_the_function_that_lets_it_out(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    # the ValueError comes out of a decorator's wrapper, not out of `first`: at the test's call
    # it still replaces the reported IndexError
    wrapped = (
        SEQ_DIFF
        + "@@ -1,2 +1,12 @@\n+def _nonempty(f):\n+    def wrapper(xs):\n+        if not xs:\n"
        "+            raise ValueError('empty')\n+        return f(xs)\n+\n+    return wrapper\n"
        "+\n+\n+@_nonempty\n def first(xs):\n     return xs[0]\n"
    )

    verdict = _seq_proof(
        make_upstream, tmp_path, EMPTY_TEST, wrapped, _seq_report("I expected None.")
    )

    assert verdict.passed is False
    assert verdict.reason.startswith(
        "the change trades the reported error for another: at tests/test_seq.py:10 the "
        "reproducing tests get IndexError out of first (shop/seq.py) without it, as the report "
        "shows, and ValueError out of _nonempty.<locals>.wrapper (shop/seq.py) with it"
    ), verdict.reason


def test_an_error_a_later_call_of_the_test_expects_is_not_taken_for_another_error(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    # without the fix the test stops at its first call (IndexError); with it, it goes on to a
    # call that expects a TypeError, which arrives at another line: not a trade
    test = EMPTY_TEST.replace(
        "with contextlib.suppress(ValueError):\n            first([])",
        "self.assertIsNone(first([]))\n        with self.assertRaises(TypeError):\n"
        "            first(None)",
    )
    fix = (
        SEQ_DIFF + "@@ -1,2 +1,4 @@\n def first(xs):\n+    if len(xs) == 0:\n+        return None\n"
        "     return xs[0]\n"
    )

    verdict = _seq_proof(make_upstream, tmp_path, test, fix, _seq_report("I expected None."))

    assert len(verdict.fail_to_pass) == 1, verdict.reason
    assert verdict.reason.startswith("the repository has no test command"), verdict.reason
    assert verdict.let_out.startswith("with the change: TypeError out of first (shop/seq.py)")


def test_a_proof_says_which_errors_the_code_still_lets_out_to_the_tests_that_pass(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    # an IndexError turned into a ValueError the test swallows, with no report's error to hold
    # it to (tests/workers: `..._trades_the_reported_error_...`): proven, and the review is told
    verdict = _seq_proof(make_upstream, tmp_path, EMPTY_TEST, REVERSED)

    assert verdict.fail_to_pass == [
        "tests.test_seq.FirstTest.test_first_of_nothing_raises_no_index_error"
    ], verdict.reason
    assert verdict.let_out == (
        "with the change: ValueError out of first (shop/seq.py); without it: IndexError out of "
        "first (shop/seq.py)"
    )
    shown = evidence(Fix, {"proof": verdict.model_copy(update={"passed": True}).model_dump()})
    assert f"- errors the code lets out to the reproducing tests: {verdict.let_out}" in shown


def test_a_proof_whose_change_lets_nothing_out_says_nothing_of_it(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    guarded = REVERSED.replace("raise ValueError('empty')", "return None")
    test = EMPTY_TEST.replace("with contextlib.suppress(ValueError):\n            first([])",
                              "self.assertIsNone(first([]))")  # fmt: skip

    verdict = _seq_proof(make_upstream, tmp_path, test, guarded)

    assert len(verdict.fail_to_pass) == 1, verdict.reason
    assert verdict.let_out == ""

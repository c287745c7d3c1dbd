"""Test outcomes by test id, read from what a test runner printed.

Understood: pytest's short summary (`-rA`: `PASSED tests/test_a.py::test_x`), unittest's
verbose lines (`test_x (tests.test_a.CartTest.test_x) ... ok`), TAP (`ok 1 - name`, as
`node --test`, tape and tap print it) and the check marks of mocha's and jest's spec reporters.
What none of them explains is left out: an empty result means the output named no test.

    outcomes = parse(output)
    outcomes.passed, outcomes.failed   # sorted test ids
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    """Failed, or broke before it could (pytest's and unittest's errors count here)."""
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Outcomes:
    """Each test id's outcome; a test reported twice keeps its worst one."""

    by_id: dict[str, Outcome] = field(default_factory=dict)
    runner: str | None = None
    """Whose output it was: `pytest`, `unittest`, `tap` or `spec`; None: no test was named."""

    @property
    def passed(self) -> list[str]:
        return sorted(i for i, o in self.by_id.items() if o == Outcome.PASSED)

    @property
    def failed(self) -> list[str]:
        return sorted(i for i, o in self.by_id.items() if o == Outcome.FAILED)

    @property
    def skipped(self) -> list[str]:
        return sorted(i for i, o in self.by_id.items() if o == Outcome.SKIPPED)


_PYTEST = re.compile(
    r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (?!\[\d+\])(\S.*?)(?: - .*)?$", re.MULTILINE
)
_PYTEST_KIND = {
    "PASSED": Outcome.PASSED,
    "XPASS": Outcome.PASSED,
    "FAILED": Outcome.FAILED,
    "ERROR": Outcome.FAILED,
    "XFAIL": Outcome.SKIPPED,
    "SKIPPED": Outcome.SKIPPED,
}
_UNITTEST_HEAD = re.compile(r"^(\w+) \(([\w.]+)\)", re.MULTILINE)
_UNITTEST_RESULT = re.compile(
    r"(?:^|\.\.\. )(ok|FAIL|ERROR|skipped\b|expected failure|unexpected success)", re.MULTILINE
)
"""After a test's name line and its ` ... `: its outcome, on that line or, when the test wrote
something first (a warning, say), at the start of a later one."""
_UNITTEST_KIND = {
    "ok": Outcome.PASSED,
    "unexpected success": Outcome.FAILED,
    "FAIL": Outcome.FAILED,
    "ERROR": Outcome.FAILED,
    "skipped": Outcome.SKIPPED,
    "expected failure": Outcome.SKIPPED,
}
_TAP = re.compile(r"^\s*(not ok|ok) \d+(?: -)? (.+?)\s*(#\s*(?:SKIP|TODO)\b.*)?$", re.MULTILINE)
_TAP_SUBTEST = re.compile(r"^(\s*)# Subtest: (.+)$", re.MULTILINE)
_SPEC_PASS = re.compile(r"^\s+[✓✔√] (.+?)(?: \(\d+(?:\.\d+)? ?m?s\))?$")
_SPEC_FAIL = re.compile(r"^\s+(?:[✕✖×]|\d+\)) (.+?)(?: \(\d+(?:\.\d+)? ?m?s\))?$")
_SPEC_FILE = re.compile(r"^(?:PASS|FAIL) (\S+)")
"""jest's line before a test file's results."""
_SPEC_END = re.compile(r"^\s*\d+ (?:passing|failing|pending)\b|^Tests:\s")
"""The summary after which a spec reporter details its failures (not tests of their own)."""

_WORSE = [Outcome.SKIPPED, Outcome.PASSED, Outcome.FAILED]


def parse(output: str) -> Outcomes:
    """The outcomes the output names, read by the first runner whose format it shows."""
    for runner, read in (
        ("pytest", _pytest),
        ("unittest", _unittest),
        ("tap", _tap),
        ("spec", _spec),
    ):
        found = read(output)
        if found:
            return Outcomes(found, runner)
    return Outcomes()


def with_ids(command: str) -> str:
    """The test command, asked to name every test it runs: `-rA` for pytest, `-v` for
    unittest; any other command as it is (TAP and spec reporters name them anyway)."""
    words = shlex.split(command)
    if _runs("pytest", words) and not any(w.startswith("-r") for w in words):
        return command + " -rA"
    if _runs("unittest", words) and not {"-v", "--verbose"} & set(words):
        return command + " -v"
    return command


def with_tracebacks(command: str) -> str:
    """The test command, asked for Python's own tracebacks, which name every function on the
    stack (`--tb=native` for pytest, unless it chose a form); any other command as it is."""
    words = shlex.split(command)
    if _runs("pytest", words) and not any(w.startswith("--tb") for w in words):
        return command + " --tb=native"
    return command


def _runs(module: str, words: list[str]) -> bool:
    if not words:
        return False
    program = words[0].rsplit("/", 1)[-1]
    return program == module or ("-m" in words[:3] and module in words[1:3])


def _keep(found: dict[str, Outcome], test_id: str, outcome: Outcome) -> None:
    known = found.get(test_id)
    if known is None or _WORSE.index(outcome) > _WORSE.index(known):
        found[test_id] = outcome


def _pytest(output: str) -> dict[str, Outcome]:
    found: dict[str, Outcome] = {}
    if "short test summary info" not in output:
        return found
    summary = output[output.rindex("short test summary info") :]
    for kind, test_id in _PYTEST.findall(summary):
        _keep(found, test_id.strip(), _PYTEST_KIND[kind])
    return found


def _unittest(output: str) -> dict[str, Outcome]:
    found: dict[str, Outcome] = {}
    heads = list(_UNITTEST_HEAD.finditer(output))
    followers: list[re.Match[str] | None] = [*heads[1:], None] if heads else []
    for head, following in zip(heads, followers, strict=True):
        segment = output[head.end() : following.start() if following else len(output)]
        dots = segment.find(" ... ")
        if dots < 0:
            continue
        result = _UNITTEST_RESULT.search(segment, dots)
        if result is None:
            continue
        method, where, kind = head.group(1), head.group(2), result.group(1)
        # Python 3.11 prints the whole dotted path; older ones only module.Class.
        test_id = where if where.endswith("." + method) else f"{where}.{method}"
        _keep(found, test_id, _UNITTEST_KIND["skipped" if kind == "skipped" else kind])
    return found


def _tap(output: str) -> dict[str, Outcome]:
    """TAP lines, a subtest's name before its tests' (`group > inner`): a subtest's own
    closing line is not a test when it had tests of its own."""
    found: dict[str, Outcome] = {}
    parents: list[tuple[int, str]] = []
    subtests = [
        (m.start(), len(m.group(1)), m.group(2), None) for m in _TAP_SUBTEST.finditer(output)
    ]
    results = [(m.start(), _indent(m.group(0)), m.group(2), m) for m in _TAP.finditer(output)]
    for _, indent, name, result in sorted([*subtests, *results], key=lambda event: event[0]):
        parents = [p for p in parents if p[0] < indent]
        if result is None:
            parents.append((indent, name))
            continue
        test_id = " > ".join([*(p[1] for p in parents), name])
        if any(k.startswith(test_id + " > ") for k in found):
            continue
        if result.group(3):
            outcome = Outcome.SKIPPED
        else:
            outcome = Outcome.PASSED if result.group(1) == "ok" else Outcome.FAILED
        _keep(found, test_id, outcome)
    return found


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _spec(output: str) -> dict[str, Outcome]:
    """Check marks of mocha's and jest's spec reporters, each test named by its file (jest's
    `PASS path` line), the groups it is indented under and its own name, `>` between: two
    tests of one name in two groups or files are two tests."""
    found: dict[str, Outcome] = {}
    file: list[str] = []
    groups: list[tuple[int, str]] = []
    for line in output.splitlines():
        if _SPEC_END.match(line):
            break
        header = _SPEC_FILE.match(line)
        if header:
            file, groups = [header.group(1)], []
            continue
        if not line.strip() or not line[0].isspace():
            continue
        indent = _indent(line)
        while groups and groups[-1][0] >= indent:
            groups.pop()
        mark = _SPEC_PASS.match(line) or _SPEC_FAIL.match(line)
        if mark is None:
            groups.append((indent, line.strip()))
            continue
        outcome = Outcome.PASSED if mark.re is _SPEC_PASS else Outcome.FAILED
        _keep(found, " > ".join([*file, *(g for _, g in groups), mark.group(1).strip()]), outcome)
    return found

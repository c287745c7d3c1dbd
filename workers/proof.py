"""Proof of a fix: Baton runs the tests itself, never taking the model's word for them.

* `run_tests`: a stage's verification command, before and after its agent's change, with the
  counts from the runner's own summary line (pytest or unittest; none: only the exit code).
* `check_reproduction`: a reproducing stage's test, on the unchanged code with only its test
  files applied, must fail, and show the failure the stage named.
* `prove`: the reproducing tests fail with only the change's test files applied and pass with
  the whole change, and no test of the repository's suite that passed before fails after; each
  measured in a clean workspace of the run's environment, by test id (`workers.outcomes`). A
  change whose code files differ only in comments, whitespace or docstrings
  (`workers.substance`) is not proven, whatever its tests say; nor is one that weakens the
  tests (`workers.weakening`: a reproducing test that no longer fails without the code, or one
  of the suite skipped or gone), nor one that special-cases the tests' inputs
  (`workers.shortcuts`). `CHECKS` names each refusal.
* `evidence`: what a pull request body says of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from orchestrator.core.facts import Fact, Proof, Reproduced, TestCounts, TestRun, recorded
from orchestrator.core.reported import ReportedFailure
from workers import trace
from workers.errors import NotReproducedError, StageError
from workers.failures import on_stack, raised_types
from workers.outcomes import Outcome, Outcomes, parse, with_ids, with_tracebacks
from workers.shortcuts import special_cases
from workers.substance import only_inert
from workers.tools.artifacts import ArtifactSink
from workers.tools.code import TEST_ENV, split_command
from workers.tools.errors import ToolError
from workers.tools.workspace import SEARCH_LIMIT, CommandResult, Workspace
from workers.weakening import weakened

_PYTEST = re.compile(r"(\d+) (passed|failed|errors?)\b")
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_UNITTEST_FAILED = re.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)


def counts(output: str) -> tuple[int | None, int | None]:
    """(passed, failed) from a pytest or unittest summary; (None, None) if neither is there."""
    ran = _UNITTEST_RAN.findall(output)
    if ran:
        failed = 0
        summary = _UNITTEST_FAILED.findall(output)
        if summary:
            for part in summary[-1].split(","):
                kind, _, number = part.strip().partition("=")
                if kind in ("failures", "errors") and number.isdigit():
                    failed += int(number)
        skipped = re.findall(r"skipped=(\d+)", summary[-1]) if summary else []
        return int(ran[-1]) - failed - sum(map(int, skipped)), failed
    found = {}
    for number, kind in _PYTEST.findall(output):
        found[kind.rstrip("s") if kind.startswith("error") else kind] = int(number)
    if not found:
        return None, None
    return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0)


def test_run(command: str, result: CommandResult) -> TestRun:
    passed, failed = counts(result.output)
    return TestRun(
        command=command,
        exit_code=None if result.timed_out else result.exit_code,
        passed=passed,
        failed=failed,
        timed_out=result.timed_out,
    )


def succeeded(run: TestRun) -> bool:
    return run.exit_code == 0 and not run.timed_out and not run.failed


def describe(run: TestRun) -> str:
    """`exit code 1, 2 passed, 2 failed` — for reasons and pull request texts."""
    ending = "timed out" if run.timed_out else f"exit code {run.exit_code}"
    if run.passed is None:
        return ending
    return f"{ending}, {run.passed} passed, {run.failed} failed"


def run_tests(workspace: Workspace, command: str, *, timeout_s: float) -> tuple[TestRun, str]:
    """Run `command` (no shell) in the workspace; the measured result and the full log.

    Raises:
        StageError: the command cannot be parsed, is empty or uses shell operators.
    """
    try:
        argv = split_command(command)
    except ToolError as exc:
        raise StageError(f"the test command {command!r} is unusable: {exc.message}") from exc
    try:
        result = workspace.run(argv, timeout_s=timeout_s, env=TEST_ENV)
    except ToolError as exc:  # the environment's build step failed: no test ran
        log = f"$ {command}\n{exc.message}\n[not run]\n"
        return TestRun(command=command, exit_code=None, passed=0, failed=None), log
    ending = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    log = f"$ {command}\n{result.output}\n[{ending}]\n"
    return test_run(command, result), log


def evidence(schema: type[BaseModel], verified: Mapping[str, Any] | None) -> str:
    """The test results a pull request carries, from the output of the stage that verified or
    proved (its `schema` says which fields hold what Baton measured)."""
    after = recorded(schema, verified, Fact.TESTS_AFTER, TestRun)
    lines: list[str] = []
    if after is not None:
        lines.append(f"Verified by Baton in a sandbox with `{after.command}`:")
        before = recorded(schema, verified, Fact.TESTS_BEFORE, TestRun)
        if before is not None:
            lines.append(f"- before the change: {describe(before)}")
        lines.append(f"- after the change: {describe(after)}")
    verdict = recorded(schema, verified, Fact.PROOF, Proof)
    if verdict is not None:
        lines += _proof_lines(verdict)
    return "\n".join(lines)


def _proof_lines(verdict: Proof) -> list[str]:
    if not verdict.passed:
        return []
    f2p = ", ".join(f"`{i}`" for i in verdict.fail_to_pass) or "the reproducing tests"
    lines = [
        "",
        "Proven by Baton in clean sandboxes:",
        f"- `{verdict.reproducing_command}`: {f2p} fail without the change's code and pass with it",
    ]
    if verdict.report_check:
        lines.append(f"- the reproduction held to the report: {verdict.report_check}")
    if verdict.let_out:
        lines.append(f"- errors the code lets out to the reproducing tests: {verdict.let_out}")
    if verdict.suite_before is not None and verdict.suite_after is not None:
        lines.append(
            f"- `{verdict.suite_command}`: {verdict.suite_before.passed} passed, "
            f"{verdict.suite_before.failed} failed before; {verdict.suite_after.passed} passed, "
            f"{verdict.suite_after.failed} failed after; no test that passed before fails"
        )
    return lines


# -- reproduction and proof -------------------------------------------------------------------

MAX_IDS = 50
"""Test ids a verdict lists by kind; the count says how many more there were."""
TAIL_CHARS = 1_500
MAX_LET_OUT = 3
"""Exceptions a proof names of those the code let out to the tests, each side."""
ENDING_LINES, ENDING_CHARS = 4, 400
"""How much of what a non-reproducing test printed instead its error names."""
TEST_PATH = re.compile(
    r"(^|/)(tests?|testing|__tests__|spec)/"
    r"|(^|/)(test_[^/]*|[^/]*_tests?\.py|conftest\.py|[^/]*\.(test|spec)\.[jt]sx?)$"
)
"""Paths that hold tests: a `tests/`, `test/`, `testing/`, `__tests__/` or `spec/` folder, or a
file named like `test_x.py`, `x_test.py`, `conftest.py`, `x.test.js`, `x.spec.ts`."""

CHECKS = {
    "weakened tests": "the change weakens the tests",
    "special case": "the change special-cases the tests' inputs",
    "inert change": "alters only comments, whitespace or docstrings",
    "off the failing path": "the change touches no line of",
    "already passing": "already pass without the change's code",
    "still failing": "the reproducing tests still fail with the change",
    "regression": "that passed before fail with the change",
    "not built": "the tests could not run",
    "publish rule": "would not be published",
    "another error": "the change trades the reported error for another",
}
"""Each refusal of a proof by name, and the words its reason holds (`baton eval` counts where a
wrong fix was stopped by them)."""

OpenClean = Callable[[], AbstractContextManager[Workspace]]
"""Opens a clean workspace of the run's environment at the pinned commit, nothing applied."""


def is_test_file(path: str) -> bool:
    return TEST_PATH.search(path) is not None


def split_diff(diff: str) -> dict[str, str]:
    """A git diff's sections by the path they change (the new path), whatever its two prefixes
    (`a/` and `b/`, or others: `git diff -R` swaps them)."""
    sections: dict[str, str] = {}
    starts = list(re.finditer(r"^diff --git [^/\s]+/(.*?) [^/\s]+/(.*)$", diff, re.MULTILINE))
    for match, following in zip(starts, [*starts[1:], None][: len(starts)], strict=True):
        end = following.start() if following else len(diff)
        sections[match.group(2)] = diff[match.start() : end]
    return sections


def only_tests(diff: str, test_files: Iterable[str] = ()) -> str:
    """The sections of `diff` that change test files (by path, or named in `test_files`)."""
    named = set(test_files)
    return "".join(s for path, s in split_diff(diff).items() if path in named or is_test_file(path))


def diff_stat(diff: str) -> str:
    """One line per changed file: `path | +added -removed`."""
    lines = []
    for path, section in split_diff(diff).items():
        body = section.splitlines()
        added = sum(1 for ln in body if ln.startswith("+") and not ln.startswith("+++"))
        removed = sum(1 for ln in body if ln.startswith("-") and not ln.startswith("---"))
        lines.append(f"{path} | +{added} -{removed}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Ran:
    """One command run for a proof: exit status, the outcomes it named, its log."""

    command: str
    result: CommandResult
    outcomes: Outcomes

    @property
    def ok(self) -> bool:
        return self.result.exit_code == 0 and not self.result.timed_out and not self.outcomes.failed

    @property
    def counts(self) -> TestCounts:
        if self.outcomes.by_id:
            return TestCounts(passed=len(self.outcomes.passed), failed=len(self.outcomes.failed))
        passed, failed = counts(self.result.output)
        return TestCounts(passed=passed or 0, failed=failed or 0)

    def log(self, title: str) -> str:
        ending = "timed out" if self.result.timed_out else f"exit code {self.result.exit_code}"
        return f"## {title}\n$ {self.command}\n{self.result.output}\n[{ending}]\n\n"


def _run(
    workspace: Workspace, command: str, *, shell: bool, timeout_s: float, traced: bool = False
) -> _Ran:
    """`command` asked to name its tests (`with_ids`); with `shell`, through `sh -c` (the
    repository's own test command may use shell syntax), else split without a shell; `traced`:
    with the line tracer (`workers.trace`), which the workspace must hold."""
    named = with_ids(command)
    try:
        argv = ["sh", "-c", named] if shell else split_command(named)
    except ToolError as exc:
        raise StageError(f"the test command {command!r} is unusable: {exc.message}") from exc
    env = dict(TEST_ENV)
    if traced:
        argv, variables = trace.traced(argv, workspace.root)
        env.update(variables)
    result = workspace.run(argv, timeout_s=timeout_s, env=env)
    return _Ran(named, result, parse(result.output))


def _applied(workspace: Workspace, diff: str, what: str) -> None:
    if not diff.strip():
        return
    try:
        workspace.apply_patch(diff)
    except ToolError as exc:
        raise StageError(f"{what} does not apply to a clean checkout: {exc.message}") from exc


def check_reproduction(
    open_clean: OpenClean,
    *,
    change: str,
    command: str,
    expected_failure: str,
    test_files: Iterable[str],
    timeout_s: float,
    artifacts: ArtifactSink,
    reported: ReportedFailure | None = None,
) -> Reproduced:
    """Run the reproducing `command` on the unchanged code with `change` (test files only)
    applied, in a clean workspace; the measured result.

    Raises:
        NotReproducedError: the change touches more than tests, or the tests do not fail with
            `expected_failure` in their output, or (when the report shows it, `reported`) not
            with the report's exception type raised through the function that raised it there.
    """
    for what, paths in (("changes", split_diff(change)), ("names", test_files)):
        others = sorted({path for path in paths if not is_test_file(path)})
        if others:
            raise NotReproducedError(
                f"the reproduction {what} files that are not tests: {', '.join(others)}; it "
                "may only add or change tests (files under tests/, test/, or named test_*, "
                "*_test.py, conftest.py, *.test.js, *.spec.ts, …)"
            )
    with open_clean() as workspace:
        _applied(workspace, change, "the reproducing test")
        asked = with_tracebacks(command) if reported is not None else command
        try:
            ran = _run(workspace, asked, shell=False, timeout_s=timeout_s)
        except ToolError as exc:  # the environment's build step failed
            raise NotReproducedError(
                f"could not reproduce the report: the unchanged code with the test: {exc.message}"
            ) from exc
    artifacts.save("reproduce.log", ran.log("the reproducing tests, unchanged code").encode())
    seen = bool(expected_failure.strip()) and expected_failure.strip() in ran.result.output
    measured = Reproduced(
        command=ran.command,
        exit_code=None if ran.result.timed_out else ran.result.exit_code,
        failed_tests=ran.outcomes.failed[:MAX_IDS],
        expected_failure_seen=seen,
        report_check=(
            f"{reported.describe()}: the reproducing test's failure raised it there"
            if reported is not None
            else "the report shows no exception and stack to hold the failure to"
        ),
    )
    failed = ran.outcomes.failed or (counts(ran.result.output)[1] or 0) > 0
    said = f"`{command}` on the unchanged code"
    if ran.result.timed_out:
        raise NotReproducedError(f"could not reproduce the report: {said} timed out")
    if ran.result.exit_code == 0 or not failed:
        raise NotReproducedError(
            f"could not reproduce the report: {said} ran no failing test "
            f"({_described(ran)}); a reproducing test must fail before the fix"
        )
    if not seen:
        raise NotReproducedError(
            f"could not reproduce the report: {said} fails ({_described(ran)}), but its output "
            f"never shows {expected_failure.strip()!r}, the failure the report is about; it "
            f"ends: {_ending(ran.result.output)}"
        )
    if reported is not None:
        _held_to(reported, ran, said)
    return measured


def _held_to(reported: ReportedFailure, ran: _Ran, said: str) -> None:
    """The reproducing test's failure is the report's: its exception type raised, through the
    function that raised it in the report.

    Raises:
        NotReproducedError: naming what the test raised, and where, against the report's.
    """
    output = ran.result.output
    types = raised_types(output)
    if reported.error_type not in types:
        shown = ", ".join(types) or "no exception Baton can read from its output"
        raise NotReproducedError(
            f"could not reproduce the report: {said} fails with {shown}, not with "
            f"{reported.error_type}, the exception {reported.source} shows; a reproducing "
            f"test must fail the way the report did"
        )
    if reported.function and not on_stack(output, reported.function):
        raise NotReproducedError(
            f"could not reproduce the report: {said} raises {reported.error_type}, but not "
            f"through {reported.function}, where {reported.source} raised it; a reproducing "
            f"test must reach the code that failed"
        )


def _ending(output: str) -> str:
    """The last few lines of a command's output, on one line: what it said instead."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " | ".join(lines[-ENDING_LINES:])[-ENDING_CHARS:] or "(no output)"


def prove(
    open_clean: OpenClean,
    *,
    change: str,
    command: str,
    test_files: Iterable[str],
    suite_command: str | None,
    timeout_s: float,
    artifacts: ArtifactSink,
    reproduced: Sequence[str] = (),
    reported: ReportedFailure | None = None,
) -> Proof:
    """Baton's verdict on `change`: the reproducing `command` with only the reproduction's test
    files (and new ones) applied (must fail) and with all of it (must pass), and the suite
    (`suite_command`, through a shell) in both (nothing that passed before may fail after, no
    test that ran may be skipped or gone); each in a clean workspace. `reproduced`: the tests
    that failed when the reproduction was measured (they must still fail without the code);
    `reported`: the failure the report shows, which the change may not trade for another."""
    named = set(test_files)
    sections = split_diff(change)
    code = [p for p in sections if p not in named and not is_test_file(p)]
    tests = [p for p in sections if p in named or is_test_file(p)]
    measure = (open_clean, command, suite_command, timeout_s, artifacts, code)
    try:
        before = _measured(
            *measure, reproduction_tests(change, test_files), "the reproduction's test files",
            "before", traced=bool(code),
            new_modules=[trace.module_name(p) for p in code if trace.creates(sections[p])],
        )  # fmt: skip
    except ToolError as exc:  # the environment's build step failed: nothing could run
        return _unbuilt(change, command, "without the change's code", exc)
    try:
        after = _measured(*measure, change, "the change", "after", tests=tests, traced=bool(code))
    except ToolError as exc:
        return _unbuilt(change, command, "with the change", exc)
    verdict = _verdict(change, before.repro, after.repro, before.suite, after.suite, suite_command)
    answered = _weakened_or_special(reproduced, before, after, {p: sections[p] for p in code})
    if answered is not None:  # the failure's tail, if any, stays: what the next attempt is shown
        return verdict.model_copy(update={"passed": False, "reason": answered})
    wrong_place = _not_the_failing_code(before, after, {p: sections[p] for p in code})
    if wrong_place is not None:
        return verdict.model_copy(
            update={"passed": False, "reason": wrong_place, "failure_tail": ""}
        )
    traded = _another_error(reported, before, after) if after.repro.ok else None
    if traded is not None:
        return verdict.model_copy(update={"passed": False, "reason": traded, "failure_tail": ""})
    return verdict.model_copy(update={"let_out": _let_out(before, after)})


def _another_error(reported: ReportedFailure | None, before: _Side, after: _Side) -> str | None:
    """Why the change trades the report's error for another that its tests accept instead of
    fixing it: at a call in the reproducing tests where the report's error (or a kind of it)
    arrived without the change, another error arrives with it, one that did not arrive there
    before, is no kind of the report's and that the report's text never names. A fix may rightly
    turn an error into a clearer one: a report that asks for one names it, and one that refines
    the report's (a `TOMLDecodeError` that is a `ValueError`) still stops whatever caught the
    old. Held to the call, not to the function that let it out, so that raising it from another
    function changes nothing, and an error a later call of the same test expects (one the test
    did not reach before) is not taken for it. None when that cannot be said (no report's
    error, or no traced run)."""
    if reported is None:
        return None
    arrived = [r for r in before.raised or [] if _reaches_tests(r)]
    calls = {(r.caller, r.line): r for r in arrived if r.is_a(reported.error_type)}
    known = {(r.caller, r.line, r.error) for r in arrived}
    for out in (r for r in after.raised or [] if _reaches_tests(r)):
        was = calls.get((out.caller, out.line))
        if (
            was is not None
            and (out.caller, out.line, out.error) not in known
            and not out.is_a(reported.error_type)
            and not reported.names(out.error)
        ):
            where = f"{out.caller}:{out.line}" if out.caller else "the test runner"
            return (
                f"{CHECKS['another error']}: at {where} the reproducing tests get "
                f"{was.describe()} without it, as the report shows, and {out.describe()} with "
                f"it, which is no kind of {reported.error_type} and which the report never names, "
                "so they pass by accepting another error, not because the failure is fixed; make "
                "the code do what the report expected"
            )
    return None


def _let_out(before: _Side, after: _Side) -> str:
    """What the code let out to the reproducing tests (to a test file, or to the runner that
    called it) with the change, and without it; "" when nothing with it. A fact for the review,
    which can hold it to what the report asked for: a check judges it only against a report's
    own error (`_another_error`)."""
    with_it, without = (_to_tests(side.raised or []) for side in (after, before))
    if not with_it:
        return ""
    was = "; ".join(r.describe() for r in without[:MAX_LET_OUT]) or "nothing"
    return (
        f"with the change: {'; '.join(r.describe() for r in with_it[:MAX_LET_OUT])}; "
        f"without it: {was}"
    )


def _to_tests(raised: Sequence[trace.Raised]) -> list[trace.Raised]:
    """Those of `raised` a function that is not a test let out to a test or the test runner,
    one per exception type and function."""
    found = {(r.error, r.path, r.function): r for r in raised if _reaches_tests(r)}
    return list(found.values())


def _reaches_tests(raised: trace.Raised) -> bool:
    """Whether a function that is not a test let it out to a test or the test runner."""
    return not is_test_file(raised.path) and (raised.caller is None or is_test_file(raised.caller))


def reproduction_tests(diff: str, test_files: Iterable[str]) -> str:
    """The sections of `diff` the proof applies without the change's code: the reproduction's
    test files (`test_files`) and test files the diff creates. A test file that existed stays
    as it was, so that what the change does to it is measured (`workers.weakening`)."""
    named = set(test_files)
    return "".join(
        s
        for path, s in split_diff(diff).items()
        if path in named or (is_test_file(path) and trace.creates(s))
    )


def _weakened_or_special(
    reproduced: Sequence[str], before: _Side, after: _Side, code: dict[str, str]
) -> str | None:
    """Why the change answers its tests instead of fixing the code: it weakens them
    (`workers.weakening`) or special-cases their inputs (`workers.shortcuts`); None if
    neither can be said."""
    if before.repro.result.timed_out:  # what it would have said is not known
        reproduced = ()
    weak = weakened(
        reproduced, before.repro.outcomes, after.repro.outcomes,
        before.suite.outcomes if before.suite else None,
        after.suite.outcomes if after.suite else None,
    )  # fmt: skip
    if weak is not None:
        return weak
    found = special_cases(after.code or {}, code, after.tests or {})
    if found:
        return (
            f"{CHECKS['special case']}: {'; '.join(found[:3])} compares against a value the "
            "reproducing tests use and returns a constant, which answers the tests without "
            "fixing the cause; fix the code for every input, not the tested ones"
        )
    return None


def _not_the_failing_code(before: _Side, after: _Side, code: dict[str, str]) -> str | None:
    """Why the change's code is not a fix of the failing code, whatever its tests say: it
    changes only what never runs (`workers.substance`), or no line the reproducing tests ran
    on the unchanged code (`workers.trace`); None when neither can be said."""
    inert = only_inert(before.code, after.code) if before.code and after.code else []
    if inert:
        return (
            f"the change alters only comments, whitespace or docstrings in {', '.join(inert)}: "
            "no code runs differently, so it cannot be what fixes the failure; change the code "
            "that fails"
        )
    if before.ran is not None and trace.off_path(code, before.ran, before.named):
        reached = sorted(before.ran)[:5]
        new = sorted(
            {trace.module_name(p) for p, section in code.items() if trace.creates(section)}
        )
        named = f"; no line they run outside the tests names {', '.join(new)}" if new else ""
        return (
            f"the change touches no line of {', '.join(sorted(code))} that the reproducing "
            "tests run on the unchanged code (they run lines of "
            f"{', '.join(reached) or 'no file of the repository'}{named}), so it cannot be "
            "what fixes the failure; change the code that fails"
        )
    return None


def _unbuilt(change: str, command: str, when: str, exc: ToolError) -> Proof:
    """The verdict when the tests could not run at all (`when`): the build step failed."""
    first, _, rest = exc.message.partition("\n")
    return Proof(
        passed=False,
        reason=f"{when}, the tests could not run: {first}",
        reproducing_command=command,
        diff_stat=diff_stat(change),
        failure_tail=rest[-TAIL_CHARS:],
    )


@dataclass(frozen=True)
class _Side:
    """One side of a proof, as measured in its clean workspace."""

    repro: _Ran
    suite: _Ran | None
    code: dict[str, str | None] | None
    """The change's code files as they were there (`_texts`)."""
    ran: dict[str, set[int]] | None = None
    """The lines the reproducing tests ran, by file (`workers.trace`), when traced."""
    tests: dict[str, str | None] | None = None
    """The test files asked for (`tests`), as they were there."""
    named: set[str] | None = None
    """Of the modules asked about (`new_modules`), those a line the reproducing tests ran
    outside the tests names; None when not asked, or it could not be told."""
    raised: list[trace.Raised] | None = None
    """The exceptions functions of the repository let out in the reproducing run, when
    traced (`trace.raised`)."""


def _measured(
    open_clean: OpenClean,
    command: str,
    suite_command: str | None,
    timeout_s: float,
    artifacts: ArtifactSink,
    read: list[str],
    diff: str,
    what: str,
    when: str,
    *,
    traced: bool = False,
    tests: list[str] | None = None,
    new_modules: Sequence[str] = (),
) -> _Side:
    """In a clean workspace with `diff` (`what`) applied: the files `read` (and `tests`) as
    they are then, the reproducing command (`traced`: with the line tracer; then which of
    `new_modules` a line it ran names), then the suite if there is one; their log is the
    artifact `proof-<when>.log`."""
    with open_clean() as workspace:
        _applied(workspace, diff, what)
        texts = _texts(workspace, read)
        test_texts = _texts(workspace, tests) if tests else None
        repro, record = _traced_run(workspace, command, timeout_s=timeout_s, traced=traced)
        ran = (
            None
            if record is None
            else trace.executed(record, workspace.root, list(split_diff(diff)))
        )
        raised = None if record is None else trace.raised(record, workspace.root)
        named = _names_run(workspace, ran, new_modules) if new_modules and ran is not None else None
        suite = (
            _run(workspace, suite_command, shell=True, timeout_s=timeout_s)
            if suite_command
            else None
        )
    logs = [
        repro.log(f"reproducing tests, {what}"),
        *([suite.log(f"suite, {what}")] if suite else []),
    ]
    artifacts.save(f"proof-{when}.log", "".join(logs).encode())
    return _Side(repro, suite, texts, ran, test_texts, named, raised)


def _names_run(
    workspace: Workspace, ran: Mapping[str, set[int]], modules: Sequence[str]
) -> set[str] | None:
    """Which of `modules` a line that `ran` shows run, in a Python file that is not a test,
    names as a word (an import of it would); None when that cannot be told (the search fails,
    or finds more than it returns)."""
    words = "|".join(re.escape(name) for name in sorted(set(modules)))
    try:
        hits = workspace.search(rf"\b({words})\b", glob="*.py", limit=SEARCH_LIMIT)
    except ToolError:
        return None
    if len(hits) >= SEARCH_LIMIT:
        return None
    named: set[str] = set()
    for hit in hits:
        path, _, rest = hit.partition(":")
        line, _, text = rest.partition(":")
        if line.isdigit() and int(line) in ran.get(path, ()) and not is_test_file(path):
            named.update(name for name in modules if re.search(rf"\b{re.escape(name)}\b", text))
    return named


def reproducing_run(
    workspace: Workspace, command: str, *, timeout_s: float, traced: bool, tests: Iterable[str]
) -> tuple[_Ran, dict[str, set[int]] | None]:
    """The reproducing `command` in `workspace` as a proof runs it; `traced`: with the line
    tracer put in the workspace first, and then the lines it recorded there, where they show
    one of `tests` (the test files applied) ran (`trace.executed`), else None. `python -m bench
    proofcost` times both."""
    repro, record = _traced_run(workspace, command, timeout_s=timeout_s, traced=traced)
    return repro, None if record is None else trace.executed(record, workspace.root, list(tests))


def _traced_run(
    workspace: Workspace, command: str, *, timeout_s: float, traced: bool
) -> tuple[_Ran, str | None]:
    """The reproducing `command` in `workspace`, and (`traced`) what the tracer recorded: ""
    when nothing, None when untraced or unreadable."""
    if traced:
        workspace.write_text(f"{trace.TRACE_DIR}/sitecustomize.py", trace.TRACER)
    repro = _run(workspace, command, shell=False, timeout_s=timeout_s, traced=traced)
    if not traced:
        return repro, None
    try:
        return repro, workspace.read_text(trace.RECORD) if workspace.exists(trace.RECORD) else ""
    except ToolError:
        return repro, None


def _texts(workspace: Workspace, paths: list[str]) -> dict[str, str | None] | None:
    """Each of `paths` as text (None: absent); None when one cannot be read as text."""
    texts: dict[str, str | None] = {}
    for path in paths:
        try:
            texts[path] = workspace.read_text(path) if workspace.exists(path) else None
        except ToolError:  # not text, or not a file: nothing to judge it by
            return None
    return texts


def _verdict(
    change: str,
    repro_before: _Ran,
    repro_after: _Ran,
    suite_before: _Ran | None,
    suite_after: _Ran | None,
    suite_command: str | None,
) -> Proof:
    failing_before = set(repro_before.outcomes.failed)
    passing_after = set(repro_after.outcomes.passed)
    regressed: list[str] = []
    if suite_before is not None and suite_after is not None:
        after = suite_after.outcomes.by_id
        regressed = [i for i in suite_before.outcomes.passed if after.get(i) != Outcome.PASSED]
    verdict = Proof(
        passed=False,
        reason="",
        reproducing_command=repro_after.command,
        fail_to_pass=sorted(failing_before & passing_after)[:MAX_IDS],
        still_failing=repro_after.outcomes.failed[:MAX_IDS],
        passed_before=repro_before.outcomes.passed[:MAX_IDS],
        pass_to_fail=regressed[:MAX_IDS],
        pass_to_fail_count=len(regressed),
        suite_command=suite_after.command if suite_after else suite_command,
        suite_before=suite_before.counts if suite_before else None,
        suite_after=suite_after.counts if suite_after else None,
        diff_stat=diff_stat(change),
    )
    failure, tail_of = _failure(repro_before, repro_after, suite_before, suite_after, regressed)
    if failure is None:
        suite = (
            f"; {verdict.suite_before.passed} suite tests passed before and pass after"
            if verdict.suite_before is not None
            else ""
        )
        proven = len(verdict.fail_to_pass) or "the"
        reason = f"proven: {proven} reproducing tests fail without the change, pass with it{suite}"
        return verdict.model_copy(update={"passed": True, "reason": reason})
    tail = tail_of.result.output[-TAIL_CHARS:] if tail_of is not None else ""
    return verdict.model_copy(update={"reason": failure, "failure_tail": tail})


def _failure(
    repro_before: _Ran,
    repro_after: _Ran,
    suite_before: _Ran | None,
    suite_after: _Ran | None,
    regressed: list[str],
) -> tuple[str | None, _Ran | None]:
    """Which part of the proof failed, and whose output shows it; (None, None) if none did."""
    if not repro_before.result.exit_code and not repro_before.outcomes.failed:
        return (
            "the reproducing tests already pass without the change's code "
            f"({_described(repro_before)}): they prove nothing about it",
            repro_before,
        )
    if repro_before.result.timed_out:
        return "the reproducing tests timed out without the change's code", repro_before
    if not repro_after.ok:
        still = repro_after.outcomes.failed
        named = f": {', '.join(still[:5])}" if still else ""
        return (
            f"the reproducing tests still fail with the change ({_described(repro_after)}){named}",
            repro_after,
        )
    if suite_before is None or suite_after is None:
        return (
            "the repository has no test command Baton knows, so no regression can be ruled "
            "out; name one in .baton/environment.toml (`test = …`)",
            None,
        )
    if suite_after.result.timed_out or suite_before.result.timed_out:
        return "the repository's tests timed out", suite_after
    if not suite_before.outcomes.by_id:
        return (
            f"the suite's output (`{suite_before.command}`) names no test, so no regression "
            "can be ruled out",
            suite_before,
        )
    if regressed:
        return (
            f"{len(regressed)} tests that passed before fail with the change: "
            f"{', '.join(regressed[:5])}",
            suite_after,
        )
    return None, None


def _described(ran: _Ran) -> str:
    if ran.result.timed_out:
        return "timed out"
    found = ran.counts
    return f"exit code {ran.result.exit_code}, {found.passed} passed, {found.failed} failed"

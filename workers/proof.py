"""Proof of a fix: Baton runs the test command itself, before and after the agent's change.

The counts come from the test runner's own summary line (pytest or unittest); when there is
none, only the exit code is known and the counts are left empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from orchestrator.schemas import Fact, TestRun, measured_fields
from workers.errors import StageError
from workers.tools.code import TEST_ENV, split_command
from workers.tools.errors import ToolError
from workers.tools.workspace import CommandResult, Workspace

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
    result = workspace.run(argv, timeout_s=timeout_s, env=TEST_ENV)
    ending = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    log = f"$ {command}\n{result.output}\n[{ending}]\n"
    return test_run(command, result), log


def evidence(schema: type[BaseModel], verified: Mapping[str, Any] | None) -> str:
    """The test results a pull request carries, from the output of the stage that verified
    (its `schema` says which fields hold the measured tests)."""
    fields = measured_fields(schema)
    if not verified or not verified.get(fields.get(Fact.TESTS_AFTER, "")):
        return ""
    after = TestRun.model_validate(verified[fields[Fact.TESTS_AFTER]])
    lines = [f"Verified by Baton in a sandbox with `{after.command}`:"]
    before = verified.get(fields.get(Fact.TESTS_BEFORE, ""))
    if before:
        lines.append(f"- before the change: {describe(TestRun.model_validate(before))}")
    lines.append(f"- after the change: {describe(after)}")
    return "\n".join(lines)

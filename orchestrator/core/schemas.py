"""Output schemas of the reference pipeline `fixer`: triage → search → plan → fix → pr.

Each is the compact, typed summary a stage hands to later stages. Big things (diffs, logs)
never go here; they are artifacts, recorded beside the stage output.

Some fields are not the model's to fill: Baton measures them itself (the tests before and
after a change, the branch and commit it published) and puts them in place of whatever the
model said. A schema declares such a field with `Measured(<Fact>)` in its annotation; the stage
runner fills every declared field from what it measured (`measured_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Fact(StrEnum):
    """What Baton can measure about a stage's work itself."""

    TESTS_BEFORE = "tests_before"
    """The verification command on the code before the stage's change (a `TestRun`)."""
    TESTS_AFTER = "tests_after"
    """The verification command after the change (a `TestRun`)."""
    PUBLISHED_BRANCH = "published_branch"
    """The branch the change was pushed to."""
    PUBLISHED_COMMIT = "published_commit"
    """The commit that holds the change on that branch."""
    REPRODUCED = "reproduced"
    """The reproducing tests run on the unchanged code (a `Reproduced`)."""
    PROOF = "proof"
    """The verdict on a change: reproducing tests fail before, pass after, no regression (a
    `Proof`)."""


@dataclass(frozen=True)
class Measured:
    """Marks an output field as measured by Baton: `Annotated[str, Measured(Fact.X)]`."""

    fact: Fact


def measured_fields(schema: type[BaseModel]) -> dict[Fact, str]:
    """The schema's measured fields: which field holds each fact it declares."""
    found: dict[Fact, str] = {}
    for name, info in schema.model_fields.items():
        for mark in info.metadata:
            if isinstance(mark, Measured):
                found[mark.fact] = name
    return found


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Triage(_Output):
    """Is this a bug in the repository that a code change can fix?"""

    actionable: bool
    reason: str = Field(description="One or two sentences: why it is or is not actionable.")
    severity: Literal["low", "medium", "high", "critical"]
    error_summary: str = Field(description="The failure in one sentence.")
    suspected_files: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list, description="Identifiers worth searching.")


class Location(_Output):
    path: str
    line_start: int = Field(ge=1)
    line_end: int = Field(ge=1)
    why: str


class Search(_Output):
    """Where the fault lives in the code."""

    root_cause: str = Field(description="The cause of the failure, in the code's terms.")
    locations: list[Location] = Field(min_length=1)
    related_tests: list[str] = Field(default_factory=list)


class Plan(_Output):
    """The change to make, before making it."""

    approach: str
    steps: list[str] = Field(min_length=1)
    files_to_change: list[str] = Field(min_length=1)
    test_command: str = Field(description="Command that runs the tests proving the fix.")


class TestRun(_Output):
    """One run of a test command in the sandbox, as Baton measured it (not as a model said)."""

    __test__ = False  # not a pytest test class

    command: str
    exit_code: int | None
    passed: int | None = Field(description="Tests that passed, when the output says.")
    failed: int | None = Field(description="Tests that failed or errored, when the output says.")
    timed_out: bool = False


class Reproduced(_Output):
    """The reproducing tests on the unchanged code, as Baton ran them in a clean sandbox."""

    command: str
    exit_code: int | None
    failed_tests: list[str] = Field(
        default_factory=list, description="Ids of the failed tests, when the output names them."
    )
    expected_failure_seen: bool
    """The output holds the failure the stage said the report is about."""


class Reproduction(_Output):
    """A test that fails on the unchanged code for the reason the report gives."""

    test_files: list[str] = Field(
        min_length=1, description="The test files you wrote or changed (or the failing ones)."
    )
    test_command: str = Field(
        description="Command that runs only the reproducing tests, e.g. `python -m pytest -q "
        "tests/test_x.py::test_y`."
    )
    expected_failure: str = Field(
        description="Text the failing tests print that shows the reported failure: the "
        "exception name or the wrong value, e.g. `ZeroDivisionError`."
    )
    explanation: str = Field(description="How the test shows the reported failure.")
    reproduced: Annotated[Reproduced | None, Measured(Fact.REPRODUCED)] = Field(
        None, description="Filled in by Baton: the test command run on the unchanged code."
    )


class TestCounts(_Output):
    """How many tests of one run passed and failed."""

    __test__ = False

    passed: int
    failed: int


class Proof(_Output):
    """Baton's verdict on a change, measured in clean sandboxes of the run's environment: the
    reproducing tests fail with only the change's test files applied and pass with the whole
    change, and no test of the repository's suite that passed before fails after."""

    passed: bool
    reason: str
    """`proven: …`, or which part failed."""
    reproducing_command: str
    fail_to_pass: list[str] = Field(default_factory=list)
    """Reproducing tests that failed before and pass after."""
    still_failing: list[str] = Field(default_factory=list)
    """Reproducing tests that fail after the change."""
    passed_before: list[str] = Field(default_factory=list)
    """Reproducing tests that already passed before the change: they prove nothing."""
    pass_to_fail: list[str] = Field(default_factory=list)
    """Suite tests that passed before and fail (or no longer run) after; at most `MAX_IDS`."""
    pass_to_fail_count: int = 0
    suite_command: str | None = None
    suite_before: TestCounts | None = None
    suite_after: TestCounts | None = None
    diff_stat: str = ""
    """`git diff --stat`-like lines of the change: which files, how many lines."""
    failure_tail: str = ""
    """The end of what the failing tests printed, when the proof failed (for the next
    attempt)."""


class Fix(_Output):
    """The change made and what the tests said."""

    summary: str
    files_changed: list[str] = Field(min_length=1)
    test_command: str
    tests_passed: bool
    tests_before: Annotated[TestRun | None, Measured(Fact.TESTS_BEFORE)] = Field(
        None, description="Filled in by Baton: the test command on the unchanged code."
    )
    tests_after: Annotated[TestRun | None, Measured(Fact.TESTS_AFTER)] = Field(
        None, description="Filled in by Baton: the test command after the change."
    )
    proof: Annotated[Proof | None, Measured(Fact.PROOF)] = Field(
        None, description="Filled in by Baton: its verdict on the change."
    )


class PullRequest(_Output):
    """The published change."""

    branch: Annotated[str, Measured(Fact.PUBLISHED_BRANCH)]
    commit: Annotated[str, Measured(Fact.PUBLISHED_COMMIT)]
    title: str
    body: str


class Summary(_Output):
    """A generic output for simple stages: a short free-text summary."""

    summary: str

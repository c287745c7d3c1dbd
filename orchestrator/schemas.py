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


class PullRequest(_Output):
    """The published change."""

    branch: Annotated[str, Measured(Fact.PUBLISHED_BRANCH)]
    commit: Annotated[str, Measured(Fact.PUBLISHED_COMMIT)]
    title: str
    body: str


class Summary(_Output):
    """A generic output for simple stages: a short free-text summary."""

    summary: str

"""Output schemas of the reference pipeline `fixer`: triage → search → plan → reproduce → fix →
review → pr.

Each is the compact, typed summary a stage hands to later stages. Big things (diffs, logs)
never go here; they are artifacts, recorded beside the stage output.

Some fields are not the model's to fill: Baton measures them itself (the tests before and
after a change, the reproduction, the proof, the branch and commit it published) and puts them
in place of whatever the model said. A schema declares such a field with `Measured(<Fact>)` in
its annotation, its type one of the engine's facts (`orchestrator.core.facts`). The fields Baton
reads (the plan's test command and files, the reproduction's command, files and expected
failure) are named by the spec beside this file, `pipeline.toml`, and checked when it loads.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.facts import Fact, Measured, Proof, Reproduced, TestRun


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


class Review(_Output):
    """An independent judgement of a proven change, by a session that did not make it."""

    reproduces_report: bool = Field(
        description="The reproducing test fails because of the failure the report describes, "
        "not for another reason, and passes only once that failure is gone."
    )
    fixes_cause: bool = Field(
        description="The change fixes the cause of that failure: it does not special-case the "
        "test's inputs, weaken, skip or rewrite a test, or change something beside the failure."
    )
    problems: list[str] = Field(
        default_factory=list,
        description="What is wrong, each precisely enough for whoever fixes it next; empty when "
        "both hold.",
    )


class PullRequest(_Output):
    """The published change."""

    branch: Annotated[str, Measured(Fact.PUBLISHED_BRANCH)]
    commit: Annotated[str, Measured(Fact.PUBLISHED_COMMIT)]
    pull_request_url: Annotated[str | None, Measured(Fact.PUBLISHED_URL)] = Field(
        None, description="Filled in by Baton: the pull request's page, when there is one."
    )
    title: str
    body: str

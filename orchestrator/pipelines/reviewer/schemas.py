"""Output schemas of the reviewer pipeline: summarise → inspect → test → review.

Each is the compact, typed summary one stage hands to the next. The test stage's run of the
tests is Baton's own measurement (`Measured(Fact.TESTS_BEFORE)`: the spec's `verify` runs the
command before the stage's agent does anything), never what its model says.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.facts import Fact, Measured, TestRun

Severity = Literal["low", "medium", "high", "critical"]
"""How much a finding matters: `critical` and `high` are bugs or risks that should block the
change, `medium` a problem worth fixing, `low` a remark."""
MAX_COMMENTS = 30
"""Comments one review may hold: a review with more is noise."""
MAX_COMMENT_CHARS = 2_000
"""A comment's text at most (GitHub takes up to 65,536 characters; a review comment is read
beside one line)."""
MAX_BODY_CHARS = 6_000
"""The review's own text at most, before the comments moved into it."""


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileChange(_Output):
    """One changed file, as the summary tells it."""

    path: str = Field(description="The file, relative to the repository root, as in the diff.")
    change: str = Field(description="What changes in it, in a sentence.")


class ChangeSummary(_Output):
    """What the pull request changes and what a reviewer should look at."""

    summary: str = Field(description="The change in two or three sentences: what and why.")
    files: list[FileChange] = Field(min_length=1)
    risks: list[str] = Field(
        default_factory=list,
        description="What could go wrong: behaviour that changes, edge cases, callers to check.",
    )


class Finding(_Output):
    """Something the code around the change shows, at one line of the head."""

    path: str
    line: int = Field(ge=1, description="The line of the file at the head of the change.")
    severity: Severity
    observation: str


class Inspection(_Output):
    """What reading the code around the change found, and how its tests run."""

    context: str = Field(description="What the surrounding code does that the change relies on.")
    findings: list[Finding] = Field(default_factory=list)
    test_command: str = Field(
        description="The command that runs the repository's tests, e.g. `python -m pytest -q`."
    )


class TestReport(_Output):
    """The repository's tests at the head of the change."""

    __test__ = False  # not a pytest test class

    summary: str = Field(description="What the tests say about the change, in a sentence or two.")
    failures: list[str] = Field(
        default_factory=list, description="Each failing test and why it fails, one line each."
    )
    untested: list[str] = Field(
        default_factory=list,
        description="Behaviour the change adds or alters that no test exercises.",
    )
    tests: Annotated[TestRun | None, Measured(Fact.TESTS_BEFORE)] = Field(
        None, description="Filled in by Baton: the test command, run at the head."
    )


class ReviewComment(_Output):
    """One comment on one line of the pull request's head: the `post_review` tool's argument."""

    path: str = Field(min_length=1, description="The file, relative to the repository root.")
    line: int = Field(
        ge=1,
        description="The line in the head's version of the file; it must be a line the pull "
        "request's diff shows (added, or near a change).",
    )
    severity: Severity
    text: str = Field(min_length=1, max_length=MAX_COMMENT_CHARS)


class Review(_Output):
    """The review as written and what happened when it was posted."""

    body: str = Field(min_length=1, max_length=MAX_BODY_CHARS,
                      description="The review's summary: the verdict and why.")  # fmt: skip
    comments: list[ReviewComment] = Field(default_factory=list, max_length=MAX_COMMENTS)
    posted: bool = Field(description="Whether post_review posted the review (or found it "
                         "posted already).")  # fmt: skip
    review_url: Annotated[str, Measured(Fact.PUBLISHED_URL)] = Field(
        "", description="Filled in by Baton: the posted review's page, as post_review answered."
    )

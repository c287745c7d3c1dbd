"""What Baton measures itself, as typed values: the engine's facts, named by no pipeline.

A stage's output schema belongs to its pipeline (the fixer's live in
`orchestrator/pipelines/fixer/schemas.py`); these types belong to the engine. Where Baton writes
a fact into a stage's output, the schema says which field holds it, by annotating the field with
`Measured(Fact.X)`; the runner fills every declared field from what it measured, whatever the
model said, and reads a recorded fact back through the same declaration (`recorded`). Where
Baton reads a field a stage wrote (a test command, the files a change may touch), the pipeline
spec names it (`orchestrator.core.pipeline`). So the runner holds no string of any pipeline's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Fact(Enum):
    """What Baton can measure about a stage's work itself. (Not a string enum: a fact has no
    name a stage's output could be read by.)"""

    TESTS_BEFORE = auto()
    """The verification command on the code before the stage's change (a `TestRun`)."""
    TESTS_AFTER = auto()
    """The verification command after the change (a `TestRun`)."""
    PUBLISHED_BRANCH = auto()
    """The branch the change was pushed to (a `str`)."""
    PUBLISHED_COMMIT = auto()
    """The commit that holds the change on that branch (a `str`)."""
    PUBLISHED_URL = auto()
    """Where a person sees what the stage published: a pull request's page, a posted review's
    (a `str`). Recorded by the built-in `publish` tool, and by a host tool that returns a
    `Publication`."""
    REPRODUCED = auto()
    """The reproducing tests run on the unchanged code (a `Reproduced`)."""
    PROOF = auto()
    """The verdict on a change: reproducing tests fail before, pass after, no regression (a
    `Proof`)."""


@dataclass(frozen=True)
class Measured:
    """Marks an output field as measured by Baton: `Annotated[TestRun | None,
    Measured(Fact.TESTS_AFTER)]`."""

    fact: Fact


def measured_fields(schema: type[BaseModel]) -> dict[Fact, str]:
    """The schema's measured fields: which field holds each fact it declares."""
    found: dict[Fact, str] = {}
    for name, info in schema.model_fields.items():
        for mark in info.metadata:
            if isinstance(mark, Measured):
                found[mark.fact] = name
    return found


class _Fact(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TestRun(_Fact):
    """One run of a test command in the sandbox, as Baton measured it (not as a model said)."""

    __test__ = False  # not a pytest test class

    command: str
    exit_code: int | None
    passed: int | None = Field(description="Tests that passed, when the output says.")
    failed: int | None = Field(description="Tests that failed or errored, when the output says.")
    timed_out: bool = False


class Reproduced(_Fact):
    """The reproducing tests on the unchanged code, as Baton ran them in a clean sandbox."""

    command: str
    exit_code: int | None
    failed_tests: list[str] = Field(
        default_factory=list, description="Ids of the failed tests, when the output names them."
    )
    expected_failure_seen: bool
    """The output holds the failure the stage said the report is about."""
    report_check: str = ""
    """How the failure was held to the report's own facts (the exception type and where it
    was raised, `orchestrator.core.reported`), or why it could not be."""


class Reproduction(_Fact):
    """A reproducing test as the stage that wrote it named it — read from the fields its spec's
    `reproduce` rule names — with what Baton measured of it on the unchanged code, if it has."""

    command: str
    """The command that runs only the reproducing tests."""
    files: tuple[str, ...]
    """The test files the stage wrote or changed (or the failing ones)."""
    failure: str
    """Text the failing tests print that shows the reported failure."""
    measured: Reproduced | None = None


class TestCounts(_Fact):
    """How many tests of one run passed and failed."""

    __test__ = False

    passed: int
    failed: int


class Proof(_Fact):
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
    report_check: str = ""
    """How the reproducing test's failure was held to the report's own facts
    (`Reproduced.report_check`)."""
    let_out: str = ""
    """The exceptions the code still lets out to the reproducing tests with the change, and
    those it let out without it (`ValueError out of interpose (toolz/itertoolz.py)`): the
    tests pass, so they expect or swallow them; for the review to hold to the report."""
    failure_tail: str = ""
    """The end of what the failing tests printed, when the proof failed (for the next
    attempt)."""


class Publication(_Fact):
    """What a host tool that publishes (posts a review, opens an issue) returns for Baton to
    record where the result went (`Fact.PUBLISHED_URL`): the model reads it as the tool's
    result, as it would any other."""

    url: str
    """The page a person opens to see it."""


FACT_TYPES: tuple[type[_Fact], ...] = (
    TestRun,
    Reproduced,
    Reproduction,
    TestCounts,
    Proof,
    Publication,
)
"""The engine's fact types: their field names are the engine's own
(tests/test_architecture.py lets the engine name them)."""

F = TypeVar("F", bound=_Fact)


def recorded(
    schema: type[BaseModel], output: Mapping[str, Any] | None, fact: Fact, kind: type[F]
) -> F | None:
    """The `fact` a recorded `output` of `schema` holds, as a `kind`; None when the schema
    declares no field for it or the output holds none there.

    Raises:
        pydantic.ValidationError: the field holds something that is not a `kind`.
    """
    name = measured_fields(schema).get(fact)
    value = output.get(name) if output is not None and name is not None else None
    return kind.model_validate(value) if value is not None else None

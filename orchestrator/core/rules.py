"""The rules a stage's spec may carry, which Baton carries out itself: its budget, when it stops
the run, what it verifies, how its reproduction and proof are read, its loop, what it may
publish, and how its history is compacted.

Each rule names the fields of the stage's output it reads (`command_from`, `field`, …), never
a name of its own: `orchestrator.core.references` checks every name against the output schema
when the pipeline loads, and what Baton writes into an output the schema declares
(`Measured(Fact.X)`, `orchestrator.core.facts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.core.facts import Reproduced, Reproduction

NAME = r"[a-z_][a-z0-9_]*"
"""A stage's, an output key's or a field's name."""
SOURCE = f"^{NAME}(?::{NAME})?\\.{NAME}$"
"""`<upstream output key>.<field>`."""
MAX_ITERATIONS = 10
"""The most iterations a loop may ask for."""
PATH = f"^{NAME}(?:\\.{NAME})*$"
"""A dotted path into a stage's own output: `<field>[.<field>…]`."""


class StageBudget(BaseModel):
    """Limits one stage execution must stay within."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tool_output_chars: int = Field(8_000, gt=0)
    """A tool result longer than this is cut, with a marker saying how much was cut."""
    max_request_tokens: int = Field(12_000, gt=0)
    """The outgoing request is trimmed to about this many tokens."""
    max_model_calls: int = Field(12, gt=0)
    """Model calls per attempt, the repair turn included."""
    max_output_chars: int = Field(4_000, gt=0)
    """A stage output longer than this (as JSON) is compacted before it is handed on."""
    soft_time_limit_s: int = Field(540, gt=0)
    time_limit_s: int = Field(600, gt=0)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> StageBudget:
        if self.soft_time_limit_s >= self.time_limit_s:
            raise ValueError("soft_time_limit_s must be below time_limit_s")
        return self


class CompactionRule(BaseModel):
    """Summarise the older part of the stage's own history when a request grows too large,
    instead of dropping it: a model writes one summary of the oldest exchanges, the newest
    `overlap` stay as they are, and trimming is left for what even that does not fit
    (`workers.compaction`). Off unless a stage sets it: each summary is a model call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trigger_tokens: int | None = Field(None, gt=0)
    """Compact when the outgoing request would be larger than this; None: the stage's
    `max_request_tokens`, so compaction comes in where trimming would."""
    overlap: int = Field(2, ge=1)
    """The newest exchanges (a model turn with its tool results) kept verbatim: at least the
    one the model is answering."""
    model: str = Field("", pattern=r"^([A-Za-z0-9][\w.:/-]*)?$")
    """The model that writes the summaries (a cheap one will do); empty: the stage's own."""
    max_summary_tokens: int = Field(1_000, gt=0)
    """A summary longer than this is cut, with a marker."""


class StopRule(BaseModel):
    """Ends the run early, as skipped, when a field of the stage's output has a given value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(pattern=f"^{NAME}$")
    """The output field compared, e.g. `actionable`."""
    equals: Any
    reason_field: str | None = Field(None, pattern=f"^{NAME}$")
    """Output field whose value becomes the run's reason."""

    def matches(self, output: Mapping[str, Any]) -> bool:
        return self.field in output and output[self.field] == self.equals

    def reason(self, output: Mapping[str, Any]) -> str:
        detail = output.get(self.reason_field) if self.reason_field else None
        return str(detail) if detail else f"{self.field} was {self.equals!r}"


class VerifyRule(BaseModel):
    """Baton itself runs a test command before and after the stage's agent, in its sandbox.

    The results fill the output's fields marked `Measured(Fact.TESTS_BEFORE)` and
    `Measured(Fact.TESTS_AFTER)`, if its schema has them; with `require_pass`, a stage whose
    tests still fail afterwards fails, so its change is never handed on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    command_from: str = Field(pattern=SOURCE)
    """`<upstream output key>.<field>` that holds the test command, e.g. `plan.test_command`."""
    require_pass: bool = True

    @property
    def source(self) -> tuple[str, str]:
        return split_source(self.command_from)


class ChangeClass(StrEnum):
    """Kinds of changed file that a publishing stage refuses unless its pipeline allows them:
    issue text is untrusted, and a change steered by it could reach further than the fix."""

    UNPLANNED = "unplanned"
    """A file the plan did not name (`PublishRule.planned_from`)."""
    CI = "ci"
    """CI, workflow or repository configuration: `.github/`, `.gitlab-ci.yml`, `Jenkinsfile`,
    `.gitattributes`, `CODEOWNERS`, …"""
    DEPENDENCIES = "dependencies"
    """A dependency manifest or lockfile (`pyproject.toml`, `requirements*.txt`,
    `package-lock.json`, …) or the repository's environment spec."""
    BINARY = "binary"
    """A file git does not diff as text."""
    EXECUTABLE = "executable"
    """A file that becomes executable."""


class PublishRule(BaseModel):
    """What a stage's `publish` tool may put on a branch. The change is checked on the worker
    host, as applied there, never as the sandbox that made it describes it; symlinks,
    submodules and paths inside `.git` are refused whatever is allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    planned_from: tuple[Annotated[str, Field(pattern=SOURCE)], ...] = ()
    """`<upstream output key>.<field>`s listing the files the change is meant to touch, e.g.
    `plan.files_to_change` and `reproduce.test_files`; any other file is `unplanned`. Empty:
    no file is unplanned."""
    allow: tuple[ChangeClass, ...] = ()
    """The classes of change published anyway (and listed in the pull request as such)."""

    @field_validator("planned_from", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @property
    def sources(self) -> list[tuple[str, str]]:
        return [split_source(source) for source in self.planned_from]


class ReproduceRule(BaseModel):
    """Baton runs the reproducing test the stage names on the unchanged code, with only the
    stage's test files applied, in a clean sandbox, and fails the stage unless the tests fail
    there and print the failure the stage expects. The measured run fills the output's field
    marked `Measured(Fact.REPRODUCED)`; a later stage's `proof` runs the same test again.

    Each `_from` names a field of the stage's own output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command_from: str = Field(pattern=f"^{NAME}$")
    """The field holding the command that runs only the reproducing tests (a string)."""
    test_files_from: str = Field(pattern=f"^{NAME}$")
    """The field listing the test files the stage wrote or changed (a list of strings)."""
    expected_failure_from: str = Field(pattern=f"^{NAME}$")
    """The field holding the text the failing tests print that shows the reported failure."""

    @model_validator(mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(
                "`reproduce` names the output fields Baton reads: reproduce = { command_from = "
                '"<field>", test_files_from = "<field>", expected_failure_from = "<field>" }'
            )
        return value

    def read(self, output: Mapping[str, Any], measured: Reproduced | None) -> Reproduction:
        """The reproducing test as `output` names it, with what Baton `measured` of it.

        Raises:
            pydantic.ValidationError: a named field does not hold what it should.
        """
        return Reproduction(
            command=output.get(self.command_from),
            files=output.get(self.test_files_from),
            failure=output.get(self.expected_failure_from),
            measured=measured,
        )


class ProofRule(BaseModel):
    """Baton proves the stage's change itself, in clean sandboxes of the run's environment:
    the reproducing tests fail with only the change's test files applied and pass with the
    whole change, and no test of the repository's suite that passed before fails after. The
    verdict fills the output's `Measured(Fact.PROOF)` field; a change without a passing proof
    is never handed on (in a loop, the next iteration tries again)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reproduction_from: str = Field(pattern=f"^{NAME}(?::{NAME})?$")
    """The output key of the earlier stage that reproduced the report (a stage with a
    `reproduce` rule): Baton runs the test that stage named, reading it through its rule."""
    suite: bool = True
    """Run the repository's whole test suite (its environment's test command) before and after
    too, and refuse a change that makes a passing test fail."""
    publishable_by: str | None = Field(None, pattern=f"^{NAME}$")
    """A later stage with the `publish` tool: the change must already pass that stage's
    `publish` rule (planned files, the classes it allows, no symlink), checked on the worker
    host as publishing checks it. A refusal is the proof's, so a looping stage is sent back with
    it instead of the run failing at its last stage."""


class LoopRule(BaseModel):
    """Run the stage again, in a fresh session, until a condition over its output holds or
    `max_iterations` have run; each iteration is seeded with a compact summary of the one
    before (`{previous_attempt?}`), never with its conversation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    until: str = Field(pattern=PATH)
    """A dotted path into the stage's output that must be true, e.g. `proof.passed`."""
    max_iterations: int = Field(3, ge=1, le=MAX_ITERATIONS)
    reason_from: str | None = Field(None, pattern=PATH)
    """A dotted path into the output that says why the condition did not hold, e.g.
    `proof.reason`: the run's reason when the iterations run out."""
    summary_from: str | None = Field(None, pattern=PATH)
    """A dotted path into the output where the stage says what it did, e.g. `summary`: quoted
    to the next iteration."""

    def holds(self, output: Mapping[str, Any]) -> bool:
        return value_at(output, self.until) is True

    def reason(self, output: Mapping[str, Any]) -> str:
        said = value_at(output, self.reason_from) if self.reason_from else None
        return str(said) if said else f"{self.until} was not true"

    def summary(self, output: Mapping[str, Any]) -> str:
        """What the iteration said it did; empty when the rule names no field or it is empty."""
        said = value_at(output, self.summary_from) if self.summary_from else None
        return str(said) if said else ""


class SendBackRule(BaseModel):
    """Judge an earlier looped stage's accepted output, and send the run back to that stage
    when the judgement does not hold (an independent review's refusal): the looped stage runs
    again, in a fresh session, told why (`{previous_attempt?}`), and the refusal counts as one
    of its iterations; the stages between run again after it. Once its `max_iterations` have
    run, the run fails with the last reason. With `then = "gate"`, a refusal parks the run on
    this stage's gate instead, where a person approves the change as it is or rejects it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    to: str = Field(pattern=f"^{NAME}$")
    """The earlier stage, by name, that has a `loop` (the fix)."""
    unless: tuple[Annotated[str, Field(pattern=PATH)], ...] = Field(min_length=1)
    """Dotted paths into this stage's output that must all be true, e.g. `fixes_cause`."""
    reason_from: str | None = Field(None, pattern=PATH)
    """A dotted path into the output that says what is wrong (a string or a list of them)."""
    then: Literal["loop", "gate"] = "loop"

    @field_validator("unless", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    def holds(self, output: Mapping[str, Any]) -> bool:
        return all(value_at(output, path) is True for path in self.unless)

    def reason(self, output: Mapping[str, Any]) -> str:
        said = value_at(output, self.reason_from) if self.reason_from else None
        if isinstance(said, list | tuple):
            said = "; ".join(str(item).strip() for item in said if str(item).strip())
        if said:
            return str(said)
        failed = [path for path in self.unless if value_at(output, path) is not True]
        return f"{', '.join(failed)} not true"


def split_source(source: str) -> tuple[str, str]:
    key, _, field = source.rpartition(".")
    return key, field


def value_at(value: Any, path: str) -> Any:
    """The value at a dotted path into nested mappings; None when any step is missing."""
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value

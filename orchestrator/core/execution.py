"""What one execution of a stage is told and reports back: the conductor's side of the
contract with the workers (`orchestrator.core.conductor`), and the labels that name an execution."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.core import branches
from orchestrator.core.models import ArtifactRef, RunRecord


def session_id(run_id: str, stage: str, attempt: int) -> str:
    return f"{run_id}:{stage}:{attempt}"


def branch_label(pipeline: str, stage: str) -> str:
    return f"{pipeline}.{stage}"


@dataclass(frozen=True)
class Held:
    """What one execution holds: a stage of a run, or one branch of a fan-out stage. The names
    it goes by follow from it, here and only here (docs/architecture.md, "Fan-out and
    fan-in")."""

    run_id: str
    stage: str
    branch: str | None = None
    """`b1` … `bN` for a branch; None for a stage that does not fan out."""

    def session_id(self, attempt: int) -> str:
        """`<run>:<stage>:<attempt>`, or `<run>:<stage>:<branch>:<attempt>`."""
        if self.branch is None:
            return session_id(self.run_id, self.stage, attempt)
        return branches.branch_session_id(self.run_id, self.stage, self.branch, attempt)

    def label(self, pipeline: str) -> str:
        """The branch label of its audit entries: `<pipeline>.<stage>[.<branch>]`."""
        if self.branch is None:
            return branch_label(pipeline, self.stage)
        return branches.branch_label(pipeline, self.stage, self.branch)

    @property
    def folder(self) -> str:
        """Where its artifacts are stored in the run: `<stage>/`, or `<stage>/<branch>/`, so
        that branches never overwrite each other's."""
        return self.stage if self.branch is None else f"{self.stage}/{self.branch}"

    def __str__(self) -> str:
        """How a log line or a message names it: `fix`, or `fix.b2`."""
        return self.stage if self.branch is None else f"{self.stage}.{self.branch}"


class StartAction(StrEnum):
    """What `Conductor.begin` decided for a delivered stage task."""

    RUN = "run"
    """Execute it: this delivery now holds the stage."""
    ADVANCE = "advance"
    """Its output is already recorded (a redelivery): only advance the run."""
    DROP = "drop"
    """The run has ended: nothing to do."""
    BUSY = "busy"
    """Another live execution holds the stage: this delivery is a duplicate."""
    EXHAUSTED = "exhausted"
    """Its executions were lost too often: the stage must fail."""


@dataclass(frozen=True)
class StageStart:
    """What `begin` decided, and the run as its transaction left it."""

    action: StartAction
    attempt: int = 0
    run: RunRecord | None = None


class Hold(StrEnum):
    """Where an execution stands with its stage (`Conductor.hold`, `Conductor.renew`)."""

    HELD = "held"
    """It holds the stage and the run goes on."""
    CANCELLED = "cancelled"
    """The run was cancelled: stop, and do nothing more that shows outside."""
    LOST = "lost"
    """Another execution holds the stage now (or the run ended otherwise): stop, record
    nothing."""


@dataclass(frozen=True)
class StageFigures:
    """What one execution of a stage cost and left behind, whether it finished or not."""

    requests: int = 0
    """Model calls made."""
    prompt_tokens_total: int = 0
    prompt_tokens_max: int = 0
    output_tokens: int = 0
    quota_wait_s: float = 0.0
    """Time slept inside the execution for the fleet's quota or a 429 cooldown."""
    artifacts: Mapping[str, ArtifactRef] = field(default_factory=dict)
    """What it stored beside the run (test logs, the diff), by name."""
    environment: str | None = None
    """The key of the environment its sandboxes started from (code stages)."""
    audit: tuple[Mapping[str, Any], ...] = ()
    """Its audit entries not yet written: the transaction that records these figures writes
    them, whatever it decides."""


@dataclass(frozen=True)
class StageResult:
    """A stage's validated output and what it cost."""

    output: dict[str, Any]
    figures: StageFigures = StageFigures()
    compacted: str | None = None
    """How an over-budget output was brought within budget: `summarized` or `truncated`."""


class Completion(StrEnum):
    """What `Conductor.complete` did with a finished stage's output."""

    RECORDED = "recorded"
    """The output is recorded (now, or by an earlier delivery) and the run moved on."""
    CANCELLED = "cancelled"
    """The run was cancelled while the stage ran: the output is not recorded, the stage is
    marked stopped (with its figures)."""
    LOST = "lost"
    """Another execution holds the stage: nothing is recorded."""

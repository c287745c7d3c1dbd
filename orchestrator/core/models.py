"""The orchestrator's data: issues, runs, stages and artifacts."""

from __future__ import annotations

import hashlib
import json
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.fanin import FanIn
from orchestrator.core.runbudget import RunBudget


class IssueSource(StrEnum):
    """Where an issue came from."""

    SENTRY_EVENT = "sentry_event"
    SENTRY_ISSUE = "sentry_issue"
    GITHUB = "github"
    PULL_REQUEST = "pull_request"
    """A GitHub pull request, or a small JSON naming a change: its base and head."""
    TEXT = "text"


class Frame(BaseModel):
    """One stack frame, as much of it as the source gave."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    line: int | None = None
    function: str | None = None
    context_line: str | None = None
    in_app: bool = False


class ChangeRefs(BaseModel):
    """The change a pull request proposes, as its payload names it: the base it goes into and
    its head, each a branch, a tag or a commit. The run pins both when it is enqueued
    (`RunRecord.base`, `RunRecord.commit`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base: str
    head: str


class Issue(BaseModel):
    """An error report in one shape, whatever its source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: IssueSource
    source_id: str | None = None
    """Event id, Sentry issue id or `owner/repo#number`; absent for plain text."""
    title: str
    error_type: str | None = None
    error_message: str | None = None
    frames: list[Frame] = Field(default_factory=list)
    """Oldest call first, the frame that raised last (Sentry's order)."""
    culprit: str | None = None
    level: str | None = None
    platform: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    links: list[str] = Field(default_factory=list)
    body: str | None = None
    change: ChangeRefs | None = None
    """The change a pull request proposes (its base and head); None for a report."""

    def idempotency_key(self) -> str:
        """Source plus source id, or a hash of the content when the source has no id."""
        if self.source_id:
            return f"{self.source.value}:{self.source_id}"
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return f"{self.source.value}:sha256:{hashlib.sha256(canonical.encode()).hexdigest()[:32]}"

    def digest(self) -> str:
        """A compact, plain-text rendering for prompts."""
        lines = [f"Title: {self.title}", f"Source: {self.source.value}"]
        if self.change:
            lines.append(f"Change: {self.change.head} into {self.change.base}")
        if self.error_type or self.error_message:
            lines.append(
                f"Error: {self.error_type or 'Error'}: {self.error_message or ''}".rstrip()
            )
        if self.culprit:
            lines.append(f"Culprit: {self.culprit}")
        if self.frames:
            lines.append("Stack (most recent call last):")
            for frame in self.frames:
                where = f"{frame.file}:{frame.line}" if frame.line else frame.file
                tag = "" if frame.in_app else "  [library]"
                lines.append(f"  {where} in {frame.function or '?'}{tag}")
                if frame.context_line:
                    lines.append(f"      {frame.context_line.strip()}")
        if self.tags:
            lines.append("Tags: " + ", ".join(f"{k}={v}" for k, v in sorted(self.tags.items())))
        if self.body:
            lines.extend(["Description:", self.body])
        return "\n".join(lines)


class RunStatus(StrEnum):
    """Where a run stands."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    """A stage is waiting out a rate limit before its next attempt."""
    DONE = "done"
    SKIPPED = "skipped"
    """A stage ended the run early (e.g. triage found the issue not actionable)."""
    FAILED = "failed"
    CANCELLED = "cancelled"
    AWAITING_APPROVAL = "awaiting_approval"
    """A gated stage is done and its output waits for a person (`baton approve`/`reject`): no
    task is queued and no worker holds the run."""
    REJECTED = "rejected"
    """A person rejected a gate; `reason` says who and why."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_RUN


_TERMINAL_RUN = {
    RunStatus.DONE, RunStatus.SKIPPED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.REJECTED,
}  # fmt: skip


class StageStatus(StrEnum):
    """Where one stage of a run stands."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class ArtifactRef(BaseModel):
    """A large output (diff, log) stored beside the run and passed around by reference."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    name: str
    size_bytes: int
    sha256: str
    media_type: str = "text/plain"

    @property
    def uri(self) -> str:
        return f"artifact://{self.run_id}/{self.name}"


class Iteration(BaseModel):
    """One finished iteration of a looped stage: what it cost and how it ended."""

    model_config = ConfigDict(extra="forbid")

    number: int
    attempt: int
    """The execution that finished it (its session is `<run>:<stage>:<attempt>`)."""
    passed: bool
    """The loop's condition held, and no later stage's `send_back` refused what it made."""
    reason: str = ""
    """Why it did not, when it did not."""
    requests: int = 0
    prompt_tokens_total: int = 0
    output_tokens: int = 0
    started_at: float | None = None
    finished_at: float | None = None


class StageRecord(BaseModel):
    """Status, attempts, timings and token use of one stage of a run."""

    model_config = ConfigDict(extra="forbid")

    status: StageStatus = StageStatus.PENDING
    attempts: int = 0
    iteration: int = 1
    """The iteration of a looped stage that is running or ran last; for a stage a `send_back`
    sent the run back over, the looped stage's iteration it runs after (1 for any other)."""
    iterations: list[Iteration] = Field(default_factory=list)
    """The finished iterations of a looped stage, in order."""
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    requests: int = 0
    """Model calls made by the attempt that produced the output."""
    prompt_tokens_total: int = 0
    prompt_tokens_max: int = 0
    output_tokens: int = 0
    output_chars: int = 0
    waiting_until: float | None = None
    """When a rate-limited stage will be tried again (epoch seconds)."""
    rate_limit_wait_s: float = 0.0
    """Total time this stage has been told to wait by 429s."""
    rate_limit_retries: int = 0
    infrastructure_retries: int = 0
    """Times this stage was put back on its queue because something outside it failed (the
    Docker daemon, say); 429s and lost workers do not count."""
    quota_wait_s: float = 0.0
    """Time this stage slept waiting for the fleet's model quota or a 429 cooldown."""
    interrupted: int = 0
    """Executions that never finished (their worker was lost); capped."""
    owner: str | None = None
    """The execution holding the stage: `<host>:<pid>:<task id>`."""
    lease_until: float | None = None
    """The owner renews this while it works; a lapsed lease means the owner is gone."""
    compacted: str | None = None
    """How an over-budget output was brought within budget: `summarized` or `truncated`."""
    error: str | None = None
    session_id: str | None = None
    artifacts: dict[str, ArtifactRef] = Field(default_factory=dict)
    fan_in: FanIn | None = None
    """A fan-out stage's branches and its join (`orchestrator.core.fanin`); None for a stage
    that runs as one execution."""

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round(self.finished_at - self.started_at, 3)


class GateStatus(StrEnum):
    """Where one gate stands (`orchestrator.core.gates`)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    """No decision came within its `timeout_s`, and its rule said to fail the run."""


class GateRecord(BaseModel):
    """One gate of a run: a stage's output waiting for (or given) a person's decision."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    branch: str | None = None
    """The branch of a fan-out stage whose output it holds (`fix.b2`'s gate); None: the
    stage's own output."""
    output_key: str | None = None
    """Where the output it holds is recorded (`plan`, a branch's `fix#b2`): what an approver
    reads, and edits."""
    approve: str
    """What is approved: `plan` (an output a person may edit) or `diff` (the stage's artifacts
    and proof, approved or rejected as they are)."""
    status: GateStatus = GateStatus.PENDING
    opened_at: float
    deadline: float | None = None
    """When its timeout falls (epoch seconds); None: it waits as long as it takes."""
    on_timeout: str = "fail"
    escalated_at: float | None = None
    """When its timeout fell, for a gate whose rule escalates rather than fails."""
    artifacts: list[str] = Field(default_factory=list)
    """The stage's artifacts (a diff, its proof) a person reviews with the output."""
    decided_at: float | None = None
    decided_by: str | None = None
    reason: str | None = None
    """Why it was rejected (or expired)."""
    edited: bool = False
    """It was approved with an edited output, which replaced the stage's own."""


class RunRecord(BaseModel):
    """One run of a pipeline over one issue and one repository."""

    model_config = ConfigDict(extra="forbid")

    id: str
    pipeline: str
    """The pipeline's name (its spec's `name`, never the path it was read from)."""
    pipeline_hash: str | None = None
    """The SHA-256 of the spec the run pinned at enqueue (`Pipeline.digest`); the spec itself
    is kept beside the run (`keys.pipeline`), and every stage of the run executes it. None: a
    run recorded before runs pinned their pipeline, which loads it by name."""
    repo: str
    commit: str
    issue: Issue
    base: str | None = None
    """The commit a change is measured against (a pull request's base, `--base`): the run's
    `commit` is the change's head, and a stage that reads `{change}` gets the diff from `base`
    to `commit`. None: the run is not about a change."""
    idempotency_key: str
    status: RunStatus = RunStatus.QUEUED
    reason: str | None = None
    """Why the run ended, when it did not simply finish."""
    current_stage: str | None = None
    environment: str | None = None
    """The key of the environment its code stages run in (`baton-env:<key>`), once known."""
    environment_spec: dict[str, Any] | None = None
    """The environment spec given at enqueue (`baton enqueue --env FILE`, as its TOML table),
    used instead of the repository's own; None: the repository's, or what its files imply."""
    budget: RunBudget | None = None
    """The run's budget: its pipeline's `[run_budget]` with the limits given at enqueue in
    place of its own, fixed at enqueue; None: no limits."""
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    gates: dict[str, GateRecord] = Field(default_factory=dict)
    """Its gates by id (`orchestrator.core.gates.gate_id`): a gate is keyed on its own, so
    several may be pending at once and each is decided once."""

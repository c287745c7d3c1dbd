"""The fan-in of a stage that runs as branches: per-branch records, a branch claimed and
recorded idempotently, the join made once, and the selection of the branch that wins.

Pure: every function here changes a `FanIn` in memory and returns what it decided. The
conductor calls them inside the run's one Redis transaction (`RunStore.transact`), which is
what makes the join happen exactly once: the transaction in which the count of ended branches
reaches the number of branches is the only one whose `record_end` returns `Recorded.JOINED`;
a racing transaction's write finds the record's version moved on, and it re-reads a fan-in
whose branch has already ended
(docs/architecture.md, "Fan-out and fan-in").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.branches import branch_ids, branch_number, branch_session_id

if TYPE_CHECKING:
    from orchestrator.core.models import StageRecord
    from orchestrator.core.pipeline import StageSpec


class BranchStatus(StrEnum):
    """Where one branch stands."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    """Back on its queue until `waiting_until` (a 429, or a failure outside the branch)."""
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Stopped because its run was cancelled: not ended, so no join follows."""
    AWAITING_APPROVAL = "awaiting_approval"
    """It finished and its gate waits for a person (`settle` ends it either way)."""

    @property
    def ended(self) -> bool:
        return self in (BranchStatus.DONE, BranchStatus.FAILED)


class BranchRecord(BaseModel):
    """One branch of a fan-out stage: its executions, and the facts selection reads."""

    model_config = ConfigDict(extra="forbid")

    status: BranchStatus = BranchStatus.QUEUED
    attempts: int = 0
    interrupted: int = 0
    """Executions that never finished (their worker was lost)."""
    owner: str | None = None
    """The execution holding the branch: `<host>:<pid>:<task id>`."""
    lease_until: float | None = None
    session_id: str | None = None
    item: int | None = None
    """A `map` branch's index into the list it fans out over."""
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    waiting_until: float | None = None
    rate_limit_retries: int = 0
    rate_limit_wait_s: float = 0.0
    infrastructure_retries: int = 0
    proof_passed: bool | None = None
    """Whether Baton's proof of the branch's change passed (a stage with a `proof` rule)."""
    diff_bytes: int | None = None
    """The size of the branch's diff (its `workspace.diff` artifact)."""
    output_chars: int = 0
    requests: int = 0
    prompt_tokens_total: int = 0
    output_tokens: int = 0
    artifacts: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """What the branch stored beside the run (its diff, its test logs), by name, each an
    `ArtifactRef` as JSON: the selected branch's become the stage's, so a later stage applies
    the chosen change."""


class FanIn(BaseModel):
    """The branches of one fan-out stage, the count of those that ended, and the join."""

    model_config = ConfigDict(extra="forbid")

    branches: dict[str, BranchRecord] = Field(default_factory=dict)
    ended: int = 0
    """Branches that ended, done or failed; each counted once, by the completion that ended it."""
    joined: bool = False
    selected: str | None = None
    """The branch whose output became the stage's (after the join; None if none could be)."""
    carried: dict[str, int] = Field(default_factory=dict)
    """A `map` stage queued before its list is read (`open_map`): the attempts its branches
    had in a run resumed, carried on to the branches once made, so session ids stay unique."""

    @property
    def complete(self) -> bool:
        return bool(self.branches) and self.ended == len(self.branches)


def fan_out(count: int, *, items: bool = False) -> FanIn:
    """A fresh fan-in of `count` queued branches (`items`: a `map` stage's, each with its
    index into the list)."""
    return FanIn(
        branches={
            branch: BranchRecord(item=index if items else None)
            for index, branch in enumerate(branch_ids(count))
        }
    )


class Claim(StrEnum):
    """What a delivered branch task may do (`claim`), as `StartAction` for a stage."""

    RUN = "run"
    ENDED = "ended"
    """The branch ended already (a redelivery): nothing to run."""
    BUSY = "busy"
    """Another live execution holds the branch: this delivery is a duplicate."""
    EXHAUSTED = "exhausted"
    """Its executions were lost too often: the branch must fail."""


def claim(
    fan: FanIn,
    branch: str,
    *,
    run_id: str,
    stage: str,
    owner: str,
    now: float,
    lease_s: float,
    max_interrupted: int,
) -> Claim:
    """Claim `branch` for an execution by `owner`, as `Conductor.begin` claims a stage: a lapsed
    lease held by another counts as one interrupted execution."""
    record = _branch(fan, branch)
    if record.status.ended or record.status == BranchStatus.AWAITING_APPROVAL:
        return Claim.ENDED
    if record.status == BranchStatus.RUNNING and record.owner != owner:
        if record.lease_until is not None and record.lease_until > now:
            return Claim.BUSY
        record.interrupted += 1
    if record.interrupted >= max_interrupted:
        return Claim.EXHAUSTED
    record.attempts += 1
    record.status, record.owner, record.lease_until = BranchStatus.RUNNING, owner, now + lease_s
    record.started_at, record.finished_at, record.error = now, None, None
    record.waiting_until = None
    record.session_id = branch_session_id(run_id, stage, branch, record.attempts)
    return Claim.RUN


@dataclass(frozen=True)
class BranchEnd:
    """How one execution of a branch ended, with what selection reads of it."""

    branch: str
    done: bool
    """It produced an output (False: it failed)."""
    owner: str | None = None
    """The execution reporting; None: not fenced (a completion recorded by Baton itself)."""
    error: str | None = None
    proof_passed: bool | None = None
    diff_bytes: int | None = None
    output_chars: int = 0
    requests: int = 0
    prompt_tokens_total: int = 0
    output_tokens: int = 0
    artifacts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Recorded(StrEnum):
    """What `record_end` did."""

    COUNTED = "counted"
    """The branch ended now; others are still to end."""
    JOINED = "joined"
    """The branch ended now and was the last: this transaction makes the join."""
    DUPLICATE = "duplicate"
    """The branch had ended already: nothing changed."""
    LOST = "lost"
    """Another execution holds the branch: nothing changed."""
    HELD = "held"
    """The branch finished and waits for a person (`hold_end`): not counted yet."""


def record_end(fan: FanIn, end: BranchEnd, *, now: float, by_facts: bool = True) -> Recorded:
    """Record that a branch ended, once; on the last branch, join and, `by_facts`, select
    (otherwise a judge stage chooses later, `choose`, or a `map` stage gathers every output).

    Idempotent: a branch that has ended is never counted again, so any order and any
    duplication of the same ends joins exactly once, with the same selection.
    """
    refused = _refused(fan, end)
    if refused is not None:
        return refused
    _note(_branch(fan, end.branch), end, now)
    return _count(fan, by_facts=by_facts)


def hold_end(fan: FanIn, end: BranchEnd, *, now: float) -> Recorded:
    """Record that a branch finished (done) and waits for a person's decision on it, without
    counting it as ended: `settle` does that once the decision comes. As `record_end`, a
    branch that ended, or that another execution holds, changes nothing."""
    refused = _refused(fan, end)
    if refused is not None:
        return refused
    record = _branch(fan, end.branch)
    _note(record, end, now)
    record.status = BranchStatus.AWAITING_APPROVAL
    return Recorded.HELD


def settle(
    fan: FanIn, branch: str, *, approved: bool, reason: str = "", now: float, by_facts: bool = True
) -> Recorded:
    """End a branch that awaited approval: done if `approved`, else failed with `reason`;
    counted, and the last to end joins (`record_end`). A branch not awaiting approval (settled
    before) changes nothing."""
    record = _branch(fan, branch)
    if record.status != BranchStatus.AWAITING_APPROVAL:
        return Recorded.DUPLICATE
    record.status = BranchStatus.DONE if approved else BranchStatus.FAILED
    record.finished_at, record.error = now, None if approved else reason
    return _count(fan, by_facts=by_facts)


def active(fan: FanIn) -> bool:
    """Whether a branch may still run (queued, running or waiting to retry): a run whose
    branches all ended or wait for a person holds no worker, and awaits approval."""
    running = (BranchStatus.QUEUED, BranchStatus.RUNNING, BranchStatus.WAITING)
    return any(b.status in running for b in fan.branches.values())


def _refused(fan: FanIn, end: BranchEnd) -> Recorded | None:
    record = _branch(fan, end.branch)
    if record.status.ended or record.status == BranchStatus.AWAITING_APPROVAL:
        return Recorded.DUPLICATE
    if end.owner is not None and record.owner != end.owner:
        return Recorded.LOST
    return None


def _note(record: BranchRecord, end: BranchEnd, now: float) -> None:
    """What an execution's end leaves on its branch's record."""
    record.status = BranchStatus.DONE if end.done else BranchStatus.FAILED
    record.finished_at, record.owner, record.lease_until = now, None, None
    record.error = None if end.done else (end.error or "failed")
    record.proof_passed, record.diff_bytes = end.proof_passed, end.diff_bytes
    record.output_chars, record.requests = end.output_chars, end.requests
    record.prompt_tokens_total, record.output_tokens = end.prompt_tokens_total, end.output_tokens
    record.artifacts = {name: dict(ref) for name, ref in end.artifacts.items()}


def _count(fan: FanIn, *, by_facts: bool) -> Recorded:
    """One more branch ended: the last one joins."""
    fan.ended += 1
    if not fan.complete:
        return Recorded.COUNTED
    fan.joined = True
    fan.selected = select_by_facts(fan) if by_facts else None
    return Recorded.JOINED


def postpone(
    fan: FanIn, branch: str, *, owner: str, now: float, delay_s: float, reason: str,
    rate_limited: bool,
) -> bool:  # fmt: skip
    """Put a running branch back to wait `delay_s` before its next attempt (as
    `Conductor.postpone` does a stage): a 429 (`rate_limited`) or a failure outside the branch,
    each counted against its own retry budget. False, and nothing changed, when `owner` no
    longer holds it."""
    record = _branch(fan, branch)
    if record.status != BranchStatus.RUNNING or record.owner != owner:
        return False
    record.status, record.owner, record.lease_until = BranchStatus.WAITING, None, None
    record.waiting_until, record.error = now + delay_s, reason
    if rate_limited:
        record.rate_limit_retries += 1
        record.rate_limit_wait_s = round(record.rate_limit_wait_s + delay_s, 3)
    else:
        record.infrastructure_retries += 1
    return True


def stop(fan: FanIn, branch: str, *, owner: str | None, now: float) -> bool:
    """Mark a branch of a cancelled run stopped (not ended: no join follows). False when
    `owner` no longer holds it or it had ended."""
    record = _branch(fan, branch)
    if record.status.ended or (owner is not None and record.owner != owner):
        return False
    record.status, record.finished_at = BranchStatus.CANCELLED, now
    record.owner, record.lease_until = None, None
    record.error = "stopped: the run was cancelled"
    return True


def select_by_facts(fan: FanIn) -> str | None:
    """The branch whose output becomes the stage's: among those done, one whose proof passed
    before one whose did not, then the smaller diff (a diff of unknown size last), then the
    lower branch number. None when no branch is done."""
    done = [name for name, record in fan.branches.items() if record.status == BranchStatus.DONE]
    if not done:
        return None

    def rank(name: str) -> tuple[bool, bool, int, int]:
        record = fan.branches[name]
        size = record.diff_bytes
        return (record.proof_passed is not True, size is None, size or 0, branch_number(name))

    return min(done, key=rank)


def choose(fan: FanIn, branch: str) -> str:
    """A judge's choice, checked: the branch exists and ended done.

    Raises:
        ValueError: names the branch and what the judge could have chosen.
    """
    done = sorted(
        (name for name, record in fan.branches.items() if record.status == BranchStatus.DONE),
        key=branch_number,
    )
    if branch not in done:
        raise ValueError(
            f"the judge chose {branch!r}, which is not a branch that finished; "
            f"it could choose {', '.join(done) or 'none'}"
        )
    fan.selected = branch
    return branch


def why_none(fan: FanIn) -> str:
    """Why a join selected nothing: every branch's reason, in branch order."""
    return "; ".join(
        f"{name}: {fan.branches[name].error or 'no output'}"
        for name in sorted(fan.branches, key=branch_number)
    )


def lapsed(fan: FanIn, *, now: float, late_s: float = 0.0) -> list[str]:
    """Branches the reconciler re-sends: running with a lapsed lease (their worker is gone), or
    waiting `late_s` past their retry time (the retry's message was lost)."""

    def lost(record: BranchRecord) -> bool:
        if record.status == BranchStatus.RUNNING:
            return (record.lease_until or 0) <= now
        if record.status == BranchStatus.WAITING:
            return (record.waiting_until or 0) + late_s < now
        return False

    return [name for name in sorted(fan.branches, key=branch_number) if lost(fan.branches[name])]


def _branch(fan: FanIn, branch: str) -> BranchRecord:
    if branch not in fan.branches:
        raise KeyError(f"no branch {branch!r}; the stage has {', '.join(fan.branches)}")
    return fan.branches[branch]


def open_fan(record: StageRecord, spec: StageSpec, previous: FanIn | None = None) -> None:
    """Within the transaction that queues a stage: if it fans out, its branches, all queued (a
    `map` stage's once its list is read, `map_fan`). Given the `previous` fan-in of the stage
    (a resumed run), each branch's attempt count carries on, so its session ids stay unique."""
    if not spec.fans_out:
        return
    before = {name: branch.attempts for name, branch in (previous.branches.items()
                                                         if previous else ())}  # fmt: skip
    if spec.map is not None:
        record.fan_in = FanIn(carried=before)
        return
    assert spec.parallel is not None
    record.fan_in = fan_out(spec.parallel)
    _carry(record.fan_in, before)


def map_fan(fan: FanIn, items: list[Any]) -> FanIn:
    """A `map` stage's fan-in once its list is read: one queued branch per item, each with its
    index, the attempts `fan` carried applied."""
    made = fan_out(len(items), items=True)
    _carry(made, fan.carried)
    return made


def _carry(fan: FanIn, attempts: Mapping[str, int]) -> None:
    for name, branch in fan.branches.items():
        branch.attempts = attempts.get(name, branch.attempts)

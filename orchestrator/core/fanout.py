"""A fan-out stage's run transitions: its branches queued and sent, each claimed and ended in
the run's one Redis transaction, and the join — the selected branch's output becomes the
stage's and the run moves on — made by the transaction that ends the last branch.

The bookkeeping is `orchestrator.core.fanin` (pure); this module puts it into `RunStore`
transactions and sends the branches' tasks. The conductor calls it in a few places
(docs/architecture.md, "Fan-out and fan-in").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from orchestrator.core import gates, handoffs, keys, transitions
from orchestrator.core.branches import (
    branch_label,
    branch_output_key,
    branch_session_id,
    branch_task_id,
    branch_task_name,
)
from orchestrator.core.execution import (
    Completion,
    Hold,
    StageFigures,
    StageResult,
    StageStart,
    StartAction,
)
from orchestrator.core.facts import Fact, Proof, recorded
from orchestrator.core.fanin import (
    BranchEnd,
    BranchStatus,
    Claim,
    FanIn,
    Recorded,
    active,
    claim,
    hold_end,
    lapsed,
    postpone,
    record_end,
    settle,
    stop,
    why_none,
)
from orchestrator.core.judging import candidates, judged
from orchestrator.core.mapping import gather, gathers, open_map
from orchestrator.core.models import ArtifactRef, RunRecord, RunStatus, StageRecord, StageStatus
from orchestrator.core.queue import STAGE_TASK

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor
    from orchestrator.core.pipeline import StageSpec

logger = logging.getLogger(__name__)

DIFF_ARTIFACT = "workspace.diff"
"""The artifact whose size is a branch's diff size (the code tools' `workspace.diff`)."""
_CLAIMED = {
    Claim.RUN: StartAction.RUN,
    Claim.ENDED: StartAction.ADVANCE,
    Claim.BUSY: StartAction.BUSY,
    Claim.EXHAUSTED: StartAction.EXHAUSTED,
}


def send_branches(
    conductor: Conductor,
    run_id: str,
    pipeline: str,
    spec: StageSpec,
    only: list[str] | None = None,
) -> list[str]:
    """Send one task per branch of a queued fan-out stage (ids `<run>.<stage>.<branch>`), or
    of the branches `only` names; returns the task ids. Safe to repeat: the ids are
    deterministic. A `map` stage's branches are made first, from its list (`open_map`)."""
    if spec.map is not None and not open_map(conductor, run_id, spec):
        return []
    fan = conductor.store.get(run_id).stages[spec.name].fan_in
    assert fan is not None
    sent = []
    for branch in only if only is not None else list(fan.branches):
        task_id = branch_task_id(run_id, spec.name, branch)
        conductor.dispatcher.app.send_task(
            STAGE_TASK,
            args=[run_id, spec.name, branch],
            queue=spec.queue,
            task_id=task_id,
            shadow=branch_task_name(pipeline, spec.name, branch),
            soft_time_limit=spec.budget.soft_time_limit_s,
            time_limit=spec.budget.time_limit_s,
        )
        sent.append(task_id)
    return sent


def lost_branches(
    run: RunRecord, stage: str, *, now: float, late_s: float, held: Callable[[], dict[str, str]]
) -> list[str]:
    """The branches of a running fan-out the reconciler sends again: running with a lapsed
    lease (their worker is gone), waiting `late_s` past their retry time, or queued for longer
    than `late_s` while the broker holds no message of theirs (`held`: the broker's task ids,
    read only if needed). Sending one again changes nothing in the run: the execution that
    claims it counts the lost one (`claim`)."""
    record = run.stages[stage]
    fan = _fan(record)
    lost = lapsed(fan, now=now, late_s=late_s)
    if record.queued_at is not None and record.queued_at + late_s < now:
        lost += [
            name
            for name, branch in fan.branches.items()
            if branch.status == BranchStatus.QUEUED
            and branch_task_id(run.id, stage, name) not in held()
        ]
    return lost


def requeue_lost(conductor: Conductor, run_id: str, stage: str, lost: list[str]) -> list[str]:
    """In one transaction, before the reconciler sends `lost` again: each branch still lost
    (running with a lapsed lease, counted interrupted as its claim would have; or waiting past
    its retry) goes back to queued with no owner, so that the next sweep finds its message in
    the broker instead of sending another. Returns those it put back."""
    now = time.time()

    def mutate(run: RunRecord, pipe: Any) -> list[str]:
        fan = _fan(run.stages[stage])
        back = []
        for name in lost:
            branch = fan.branches[name]
            if branch.status == BranchStatus.RUNNING and (branch.lease_until or 0) <= now:
                branch.interrupted += 1
            elif branch.status not in (BranchStatus.WAITING, BranchStatus.QUEUED):
                continue
            branch.status, branch.owner, branch.lease_until = BranchStatus.QUEUED, None, None
            branch.waiting_until = None
            back.append(name)
        return back

    back: list[str] = conductor.store.transact(run_id, mutate)
    return back


def begin_branch(
    conductor: Conductor,
    run_id: str,
    stage: str,
    branch: str,
    *,
    owner: str,
    lease_s: float,
    max_interrupted: int,
) -> StageStart:
    """Claim a delivered branch for execution, or say why not (as `Conductor.begin`)."""

    def mutate(run: RunRecord, pipe: Any) -> StageStart:
        if run.status.is_terminal:
            return StageStart(StartAction.DROP, run=run)
        record = run.stages[stage]
        fan = _fan(record)
        now = time.time()
        claimed = claim(fan, branch, run_id=run_id, stage=stage, owner=owner, now=now,
                        lease_s=lease_s, max_interrupted=max_interrupted)  # fmt: skip
        attempt = fan.branches[branch].attempts
        if claimed == Claim.RUN:
            if record.status != StageStatus.RUNNING:
                record.status, record.started_at = StageStatus.RUNNING, now
            run.status, run.current_stage = RunStatus.RUNNING, stage
        _audit(conductor, run, stage, branch, attempt, "branch_begin", pipe,
               action=claimed.value, owner=owner)  # fmt: skip
        return StageStart(_CLAIMED[claimed], attempt=attempt, run=run)

    start: StageStart = conductor.store.transact(run_id, mutate)
    return start


def renew_branch(
    conductor: Conductor, run_id: str, stage: str, branch: str, *, owner: str, lease_s: float
) -> Hold:
    """Extend the owner's lease on a running branch, if it still holds it (as
    `Conductor.renew`); says where the execution stands."""

    def mutate(run: RunRecord, pipe: Any) -> Hold:
        hold = _branch_hold(run, stage, branch, owner)
        if hold == Hold.HELD:
            _fan(run.stages[stage]).branches[branch].lease_until = time.time() + lease_s
        return hold

    hold: Hold = conductor.store.transact(run_id, mutate)
    return hold


def hold_branch(conductor: Conductor, run_id: str, stage: str, branch: str, *, owner: str) -> Hold:
    """Where an execution stands with its branch, read, not changed: the check before a side
    effect."""
    return _branch_hold(conductor.store.get(run_id), stage, branch, owner)


def _branch_hold(run: RunRecord, stage: str, branch: str, owner: str) -> Hold:
    if run.status == RunStatus.CANCELLED:
        return Hold.CANCELLED
    record = run.stages.get(stage)
    fan = record.fan_in if record is not None else None
    held = fan is not None and branch in fan.branches and fan.branches[branch].owner == owner
    return Hold.HELD if held and not run.status.is_terminal else Hold.LOST


def postpone_branch(
    conductor: Conductor,
    run_id: str,
    stage: str,
    branch: str,
    *,
    delay_s: float,
    reason: str,
    owner: str,
    rate_limited: bool = True,
    figures: StageFigures | None = None,
) -> bool:
    """Put a branch back to wait `delay_s` before its next attempt (`Conductor.postpone` for
    a branch): its siblings run on and the run stays running. False, and nothing changed but
    what the ended attempt left (`figures`), if the run has ended or `owner` no longer holds
    the branch: it must then not be retried."""

    def mutate(run: RunRecord, pipe: Any) -> bool:
        conductor.record_execution(run, pipe, figures)
        fan = _fan(run.stages[stage])
        if run.status.is_terminal:
            return False
        waiting = postpone(fan, branch, owner=owner, now=time.time(), delay_s=delay_s,
                           reason=reason, rate_limited=rate_limited)  # fmt: skip
        if waiting:
            _audit(conductor, run, stage, branch, fan.branches[branch].attempts,
                   "branch_waiting", pipe, delay_s=delay_s, reason=reason)  # fmt: skip
        return waiting

    waiting: bool = conductor.store.transact(run_id, mutate)
    return waiting


def complete_branch(
    conductor: Conductor,
    run_id: str,
    stage: str,
    branch: str,
    result: StageResult | None,
    *,
    owner: str | None = None,
    error: str | None = None,
    figures: StageFigures | None = None,
) -> Completion:
    """Record that a branch ended — with `result`, or failed with `error` after spending
    `figures` — in one transaction; the one that ends the last branch joins: the selected
    branch's output becomes the stage's, and the run moves on. A branch that ended before is
    not recorded again; a branch of a cancelled run is recorded stopped (`CANCELLED`)."""
    payload = None if result is None else json.dumps(result.output, ensure_ascii=False,
                                                     separators=(",", ":"))  # fmt: skip
    figures = result.figures if result is not None else figures
    pipeline = conductor.pipeline_of(conductor.store.get(run_id))
    spec = pipeline.stage(stage)

    def mutate(run: RunRecord, pipe: Any) -> tuple[Completion, transitions.Next | None, RunRecord]:
        conductor.record_execution(run, pipe, figures)
        record = run.stages[stage]
        fan = _fan(record)
        if run.status == RunStatus.CANCELLED:
            stopped = stop(fan, branch, owner=owner, now=time.time())
            return Completion.CANCELLED if stopped else Completion.LOST, None, run
        if run.status.is_terminal:
            return Completion.LOST, None, run
        end = _end(spec.schema_class(), branch, result, owner, error, payload, figures)
        if spec.gate is not None and result is not None:
            recorded = hold_end(fan, end, now=time.time())
        else:
            recorded = record_end(fan, end, now=time.time(), by_facts=_by_facts(spec))
        if recorded in (Recorded.DUPLICATE, Recorded.LOST):
            return (Completion.RECORDED if recorded == Recorded.DUPLICATE else Completion.LOST,
                    None, run)  # fmt: skip
        attempt = fan.branches[branch].attempts
        if payload is not None:
            pipe.hset(keys.outputs(run.id), branch_output_key(spec.output_key, branch), payload)
        _audit(conductor, run, stage, branch, attempt, "branch_done" if result else
               "branch_failed", pipe, chars=len(payload or ""), error=error)  # fmt: skip
        if recorded == Recorded.HELD:
            _open_gate(conductor, run, pipe, spec, branch)
        if recorded != Recorded.JOINED:
            _park_if_idle(run, fan)
            return Completion.RECORDED, None, run
        joined = _join(conductor, run, pipe, spec, fan, payload, branch)
        decision = handoffs.counted(conductor.store.redis, run, pipe, joined, stage)
        return Completion.RECORDED, decision, run

    done, decision, run = conductor.store.transact(run_id, mutate)
    if decision is not None:
        conductor.carry_out(run, decision, pipeline)
    return done


def _open_gate(
    conductor: Conductor, run: RunRecord, pipe: Any, spec: StageSpec, branch: str
) -> None:
    """Within the transaction that held a finished branch: its own gate, pending."""
    assert spec.gate is not None
    record = _fan(run.stages[spec.name]).branches[branch]
    gate = gates.open_gate(run, spec.name, spec.gate, artifacts=list(record.artifacts),
                           now=time.time(), branch=branch, park=False,
                           output_key=branch_output_key(spec.output_key, branch))  # fmt: skip
    _audit(conductor, run, spec.name, branch, record.attempts, "gate_opened", pipe,
           gate=gates.gate_id(spec.name, branch), approve=gate.approve)  # fmt: skip


def _park_if_idle(run: RunRecord, fan: FanIn) -> None:
    """A run whose branches have all ended or wait for a person holds no worker: it awaits
    approval until the gates are decided."""
    if gates.pending(run) and not active(fan) and not run.status.is_terminal:
        run.status = RunStatus.AWAITING_APPROVAL


def settle_gate(
    conductor: Conductor, run: RunRecord, pipe: Any, spec: StageSpec, branch: str, *,
    approved: bool, reason: str = "", output: str | None = None,
) -> transitions.Next:  # fmt: skip
    """Within the transaction that decided a branch's gate: the branch ends, done when
    `approved` (with `output`, an approver's edit, as its output), else failed with `reason`;
    the last branch to end joins, as in `complete_branch`."""
    fan = _fan(run.stages[spec.name])
    recorded = settle(fan, branch, approved=approved, reason=reason, now=time.time(),
                      by_facts=_by_facts(spec))  # fmt: skip
    if recorded != Recorded.JOINED:
        _park_if_idle(run, fan)
        return transitions.Next()
    joined = _join(conductor, run, pipe, spec, fan, output, branch)
    return handoffs.counted(conductor.store.redis, run, pipe, joined, spec.name)


def _join(
    conductor: Conductor,
    run: RunRecord,
    pipe: Any,
    spec: StageSpec,
    fan: FanIn,
    payload: str | None,
    last: str,
) -> transitions.Next:
    """Within the transaction that ended the last branch: the selected branch's output becomes
    the stage's and the run moves on; none selected, the stage and the run fail."""
    record = run.stages[spec.name]
    record.finished_at, record.lease_until = time.time(), None

    def stored(branch: str) -> str:
        if branch == last and payload is not None:
            return payload
        return _stored(conductor, run.id, spec, branch)

    if gathers(spec):
        chosen, error = gather(fan, stored)
    elif judged(spec):  # the judge, the stage after, chooses among the candidates
        chosen, error = candidates(fan, stored), f"no branch finished: {why_none(fan)}"
    elif fan.selected is None:
        chosen, error = None, f"no branch finished: {why_none(fan)}"
    else:
        chosen, error = stored(fan.selected), None
    if chosen is None:
        record.status, record.error = StageStatus.FAILED, error
        run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{spec.name}: {error}", None
        _audit(conductor, run, spec.name, "-", 0, "fan_in_failed", pipe, error=error)
        return transitions.Next(ended=True)
    pipe.hset(keys.outputs(run.id), spec.output_key, chosen)
    if fan.selected is not None:  # a gathering stage's artifacts stay its branches'
        artifacts = fan.branches[fan.selected].artifacts
        record.artifacts = {name: ArtifactRef.model_validate(r) for name, r in artifacts.items()}
    record.status, record.output_chars = StageStatus.DONE, len(chosen)
    attempt = fan.branches[fan.selected].attempts if fan.selected else 0
    _audit(conductor, run, spec.name, fan.selected or "-", attempt, "fan_in_joined", pipe,
           selected=fan.selected, ended=fan.ended)  # fmt: skip
    return conductor.after_done(run, pipe, conductor.pipeline_of(run), spec.name,
                                json.loads(chosen))  # fmt: skip


def _stored(conductor: Conductor, run_id: str, spec: StageSpec, branch: str) -> str:
    """An ended branch's output, written by the transaction that ended it and never after."""
    raw = conductor.store.redis.hget(
        keys.outputs(run_id), branch_output_key(spec.output_key, branch)
    )
    assert raw is not None, f"branch {branch} ended done without an output"
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _end(
    schema: type[BaseModel], branch: str, result: StageResult | None, owner: str | None,
    error: str | None, payload: str | None, figures: StageFigures | None,
) -> BranchEnd:  # fmt: skip
    """A branch's end as the fan-in reads it: its facts from its output and its artifacts,
    what it cost whether it finished or not."""
    spent = figures or StageFigures()
    end = BranchEnd(
        branch, done=result is not None, owner=owner, error=None if result else error,
        requests=spent.requests, prompt_tokens_total=spent.prompt_tokens_total,
        output_tokens=spent.output_tokens,
        artifacts={name: ref.model_dump(mode="json") for name, ref in spent.artifacts.items()},
    )  # fmt: skip
    diff = spent.artifacts.get(DIFF_ARTIFACT)
    end = replace(end, diff_bytes=diff.size_bytes if diff is not None else None)
    if result is None:
        return end
    proof = recorded(schema, result.output, Fact.PROOF, Proof)
    return replace(end, proof_passed=proof.passed if proof is not None else None,
                   output_chars=len(payload or ""))  # fmt: skip


def _by_facts(spec: StageSpec) -> bool:
    return spec.select is not None and spec.select.by_facts


def _fan(record: StageRecord) -> FanIn:
    if record.fan_in is None:
        raise ValueError("the stage does not run as branches")
    return record.fan_in


def _audit(
    conductor: Conductor, run: RunRecord, stage: str, branch: str, attempt: int, kind: str,
    pipe: Any, **data: Any,
) -> None:  # fmt: skip
    """An audit entry of a branch, labelled `<pipeline>.<stage>.<branch>`, in `pipe`."""
    entry = {
        "ts": repr(time.time()),
        "branch": branch_label(run.pipeline, stage, branch),
        "session": branch_session_id(run.id, stage, branch, attempt),
        "kind": kind,
        "data": data,
    }
    conductor.store.queue_audit(pipe, run.id, [entry])

"""Gates: a stage's output waits for a person before the run goes on.

A stage with a `gate` rule (`gate = { approve = "plan" }` in its pipeline) parks its run once it
is done: the transaction that records its output opens a gate and sets the run
`awaiting_approval` instead of queueing the next stage. Nothing is queued and no worker holds
anything while it waits, so a worker (or Redis) restart changes nothing; the run stays active,
where the reconciler sees a gate whose timeout fell.

    gate state   decided by                           then
    pending      approve (optionally with an edit)    approved; the next stage is queued
    pending      reject, with a reason                rejected; the run ends `rejected`
    pending      its timeout, on_timeout = "fail"     expired; the run fails
    pending      its timeout, on_timeout = "escalate" stays pending, escalated once (logged,
                                                      audited, shown) for a person to decide

Every decision is one transaction on the run record and is keyed by the gate's id, never by
"the run's current interrupt": approving an approved gate changes nothing (it is applied once,
and the next stage is queued only by the transaction that approved it), a decided gate cannot
be decided the other way, and two gates pending at once (parallel branches) are decided in
either order, each on its own. Approving continues the run after the gated stage; it never
runs a finished stage again. The functions here change a run record in place, inside the
conductor's transactions; the conductor queues what they decide.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import PipelineError, RunStateError
from orchestrator.core.facts import measured_fields
from orchestrator.core.models import GateRecord, GateStatus, RunRecord, RunStatus

if TYPE_CHECKING:
    from orchestrator.core.pipeline import StageSpec


@dataclass(frozen=True)
class Approval:
    """What an approval did."""

    applied: bool
    """False: the gate was approved before, and nothing changed."""
    queued: str | None = None
    """The stage it queued; None when none (the gated stage was the last, or not applied)."""


class GateRule(BaseModel):
    """A stage's gate: what a person approves before the run goes on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approve: Literal["plan", "diff"]
    """`plan`: the stage's output, which the approver may edit (the edit, checked against the
    stage's output schema, is what later stages see). `diff`: the stage's output with its
    artifacts (the diff and its proof), approved or rejected as they are."""
    timeout_s: float | None = Field(None, gt=0)
    """How long the gate waits for a decision; unset, as long as it takes."""
    on_timeout: Literal["fail", "escalate"] = "fail"
    """Once `timeout_s` has passed: fail the run, or escalate (log and audit it once, show it,
    and keep waiting for a person)."""


def gate_id(stage: str, branch: str | None = None) -> str:
    """The id of a gate: the stage's name, or for a branch of a fan-out stage the stage's and
    the branch's (`fix.b2`): each branch of a gated fan-out stage waits on its own gate."""
    return stage if branch is None else f"{stage}.{branch}"


def open_gate(
    run: RunRecord, stage: str, rule: GateRule, *, artifacts: list[str], now: float,
    output_key: str, branch: str | None = None, park: bool = True,
) -> GateRecord:  # fmt: skip
    """Open `stage`'s gate (or its `branch`'s) within the transaction that records its output;
    `park`: the run waits on it now (not while other branches of the stage still run)."""
    gate = GateRecord(
        stage=stage, branch=branch, output_key=output_key, approve=rule.approve, opened_at=now,
        on_timeout=rule.on_timeout,
        deadline=now + rule.timeout_s if rule.timeout_s is not None else None,
        artifacts=sorted(artifacts),
    )  # fmt: skip
    run.gates[gate_id(stage, branch)] = gate
    if park:
        run.status, run.current_stage = RunStatus.AWAITING_APPROVAL, stage
    return gate


def holds(run: RunRecord, stage: str) -> bool:
    """Whether the run may not go on past `stage`: its gate is not approved, or the run still
    awaits another gate (a redelivery then advances nothing)."""
    if run.status == RunStatus.AWAITING_APPROVAL:
        return True
    gate = run.gates.get(gate_id(stage))
    return gate is not None and gate.status != GateStatus.APPROVED


def pending(run: RunRecord) -> dict[str, GateRecord]:
    """The run's gates that wait for a decision, by id."""
    return {name: gate for name, gate in run.gates.items() if gate.status == GateStatus.PENDING}


def choose(run: RunRecord, wanted: str | None) -> str:
    """The id of the gate a decision is about: `wanted`, or the run's one pending gate (with
    none pending, the one decided last, so that a decision sent twice meets the first).

    Raises:
        RunStateError: no such gate, or none named while several (or none) are pending.
    """
    if wanted is not None:
        if wanted not in run.gates:
            known = ", ".join(sorted(run.gates)) or "none"
            raise RunStateError(f"run {run.id} has no gate {wanted!r} (its gates: {known})")
        return wanted
    waiting = sorted(pending(run))
    if len(waiting) == 1:
        return waiting[0]
    if not waiting and run.gates:
        return max(run.gates, key=lambda name: run.gates[name].decided_at or 0.0)
    if not waiting:
        raise RunStateError(f"run {run.id} has no gate awaiting approval (it is {run.status})")
    raise RunStateError(
        f"run {run.id} has {len(waiting)} gates awaiting approval ({', '.join(waiting)}); "
        "name one with --gate ID"
    )


def approve(run: RunRecord, gate: str, *, by: str, edited: bool, now: float) -> bool:
    """Approve `gate`. True: approved now (the caller continues the run); False: it was
    approved before, and nothing changes (an approval is applied once).

    Raises:
        RunStateError: the gate was rejected or expired, or the run has ended.
    """
    record = run.gates[gate]
    if record.status == GateStatus.APPROVED:
        return False
    if record.status != GateStatus.PENDING:
        raise RunStateError(
            f"gate {gate} of run {run.id} was {record.status} ({record.reason}); "
            "it cannot be approved now"
        )
    if run.status.is_terminal:
        raise RunStateError(
            f"run {run.id} has ended ({run.status}); gate {gate} cannot be approved"
        )
    record.status, record.decided_at, record.decided_by = GateStatus.APPROVED, now, by
    record.edited = edited
    _unpark(run)
    return True


def _unpark(run: RunRecord) -> None:
    """The run waits on no gate any more: it goes on (what comes next is the caller's)."""
    if not pending(run) and run.status == RunStatus.AWAITING_APPROVAL:
        run.status = RunStatus.QUEUED


def reject(run: RunRecord, gate: str, *, by: str, reason: str, now: float) -> bool:
    """Reject `gate` and end the run `rejected` with `reason` (a branch's gate: only the branch
    ends, failed; its stage goes on with the others). True: rejected now; False: it was
    rejected before (nothing changes).

    Raises:
        RunStateError: the gate was approved or expired, the run has ended, or no reason.
    """
    if not reason.strip():
        raise RunStateError(f"rejecting gate {gate} of run {run.id} needs a reason")
    record = run.gates[gate]
    if record.status == GateStatus.REJECTED:
        return False
    if record.status != GateStatus.PENDING:
        raise RunStateError(
            f"gate {gate} of run {run.id} was {record.status} already; cancel the run instead"
        )
    if run.status.is_terminal:
        raise RunStateError(
            f"run {run.id} has ended ({run.status}); gate {gate} cannot be rejected"
        )
    record.status, record.decided_at, record.decided_by = GateStatus.REJECTED, now, by
    record.reason = reason
    if record.branch is not None:
        _unpark(run)
        return True
    run.status, run.current_stage = RunStatus.REJECTED, None
    run.reason = f"{record.stage}: rejected by {by}: {reason}"
    return True


def overdue(run: RunRecord, now: float | None = None) -> dict[str, GateRecord]:
    """The pending gates whose timeout fell and that have not been acted on, by id."""
    now = time.time() if now is None else now
    return {
        name: gate
        for name, gate in pending(run).items()
        if gate.deadline is not None and gate.deadline <= now and gate.escalated_at is None
    }


def time_out(run: RunRecord, gate: str, *, now: float) -> str | None:
    """Act on an overdue gate's rule: `expired` (the run fails), `escalated` (it keeps
    waiting), or None if it is no longer overdue (decided meanwhile)."""
    if gate not in overdue(run, now) or run.status.is_terminal:
        return None
    record = run.gates[gate]
    waited_s = round(now - record.opened_at)
    if record.on_timeout == "escalate":
        record.escalated_at = now
        return "escalated"
    record.status, record.decided_at = GateStatus.EXPIRED, now
    record.reason = f"no decision within {waited_s}s"
    if record.branch is not None:  # the branch fails; its stage goes on with the others
        _unpark(run)
        return "expired"
    run.status, run.current_stage = RunStatus.FAILED, None
    run.reason = f"{record.stage}: gate {gate}: {record.reason}"
    return "expired"


def forget(run: RunRecord, stages: list[str]) -> list[str]:
    """Drop the gates of stages about to run again (a resume): their new outputs need a new
    decision. Returns the ids dropped."""
    dropped = [name for name, gate in run.gates.items() if gate.stage in stages]
    for name in dropped:
        del run.gates[name]
    return dropped


def resume_point(run: RunRecord) -> str | None:
    """Where a run that ended at a gate (rejected, or expired) resumes by default: the gated
    stage, so that its new output gets a new decision. None: it did not end at a gate."""
    ended = [
        g
        for g in run.gates.values()
        if g.branch is None and g.status in (GateStatus.REJECTED, GateStatus.EXPIRED)
    ]  # a branch's gate ends its branch, never the run
    return ended[0].stage if ended else None


def checked_edit(
    spec: StageSpec, gate: GateRecord, edit: Mapping[str, Any], stored: Mapping[str, Any]
) -> dict[str, Any]:
    """An approver's edit of a plan gate's output, validated against the stage's schema, as
    later stages will read it. The fields Baton measures (`Measured`) keep what it measured
    (`stored`, the gated output): an edit changes what the model said, never a fact.

    Raises:
        PipelineError: the gate is a diff gate (approved as it is), or the edit does not fit
            the schema (the message names the stage and each field at fault).
    """
    measured = {name: stored.get(name) for name in measured_fields(spec.schema_class()).values()}
    if gate.approve != "plan":
        raise PipelineError(
            f"gate {gate_id(spec.name, gate.branch)} approves a {gate.approve}, which is "
            "approved or rejected as it is; reject it with a reason instead of editing it"
        )
    try:
        checked = spec.schema_class().model_validate(dict(edit) | dict(measured))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise PipelineError(
            f"the edited output of stage {spec.name} does not fit its schema "
            f"{spec.output_schema}: {problems}"
        ) from None
    return checked.model_dump(mode="json")

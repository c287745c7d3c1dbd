"""Gates from the conductor's side: approve, reject and time out a run's gates, each in one
transaction on the run record, each applied once (`orchestrator.core.gates` is the pure part:
what a gate is, when it holds a run, what an approval or a rejection changes).

A branch's gate (a gated fan-out stage: each branch that finishes waits on its own, `fix.b2`)
decides that branch only: approved, it ends done; rejected or expired, it ends failed, and its
stage goes on with the others (`orchestrator.core.fanout.settle_gate`); the last branch to end
joins, whichever decision ended it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.core import fanout, gates, handoffs, keys, transitions
from orchestrator.core.branches import branch_output_key
from orchestrator.core.models import RunRecord

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor


def approve(
    conductor: Conductor, run_id: str, gate: str | None = None, *, by: str,
    edit: Mapping[str, Any] | None = None,
) -> gates.Approval:  # fmt: skip
    """Approve a gate of the run (`gate`, or its one pending gate), with `edit` replacing
    the gated output (checked against the stage's schema; audited). Says whether it was
    applied (not if the gate was approved before: nothing changes) and the stage queued.

    Raises:
        RunStateError: no such gate, it was rejected or expired, or the run has ended.
        PipelineError: `edit` does not fit the stage's output schema, or edits a diff gate.
    """
    run = conductor.store.get(run_id)
    chosen = gates.choose(run, gate)
    pipeline = conductor.pipeline_of(run)
    held = run.gates[chosen]
    spec = pipeline.stage(held.stage)
    key = (
        spec.output_key if held.branch is None else branch_output_key(spec.output_key, held.branch)
    )
    gated = conductor.store.output(run_id, key) or {}
    edited = None if edit is None else gates.checked_edit(spec, held, edit, gated)
    outputs = keys.outputs(run_id)

    def mutate(run: RunRecord, pipe: Any) -> tuple[transitions.Next | None, RunRecord]:
        if not gates.approve(run, chosen, by=by, edited=edited is not None, now=time.time()):
            return None, run
        output = conductor.store.output(run_id, key) or {}
        if edited is not None:
            pipe.hset(outputs, f"{key}.proposed", transitions.compact(output))
            pipe.hset(outputs, key, transitions.compact(edited))
        conductor.audit(run, spec.name, run.stages[spec.name].attempts, "gate_approved",
                        pipe=pipe, gate=chosen, by=by, edit=edited)  # fmt: skip
        if held.branch is not None:
            given = None if edited is None else transitions.compact(edited)
            return fanout.settle_gate(conductor, run, pipe, spec, held.branch, approved=True,
                                      output=given), run  # fmt: skip
        if gates.pending(run):  # another gate still holds the run: it goes on after that one
            return transitions.Next(), run
        chosen_output = output if edited is None else edited
        decision = transitions.decide(run, pipeline, spec.name, chosen_output)
        return handoffs.counted(conductor.store.redis, run, pipe, decision, spec.name), run

    decision, run = conductor.store.transact(run_id, mutate)
    if decision is None:
        return gates.Approval(applied=False)
    return gates.Approval(applied=True, queued=conductor.carry_out(run, decision, pipeline))


def reject(
    conductor: Conductor, run_id: str, gate: str | None = None, *, by: str, reason: str
) -> bool:
    """Reject a gate of the run (`gate`, or its one pending gate): the run ends `rejected`
    with `reason` (a branch's gate: the branch ends failed, and the stage goes on with the
    others). False if the gate was rejected before (nothing changes).

    Raises:
        RunStateError: no such gate, it was approved or expired, or the run has ended.
    """
    pipeline = conductor.pipeline_of(conductor.store.get(run_id))

    def mutate(run: RunRecord, pipe: Any) -> tuple[transitions.Next | None, RunRecord]:
        chosen = gates.choose(run, gate)
        if not gates.reject(run, chosen, by=by, reason=reason, now=time.time()):
            return None, run
        held = run.gates[chosen]
        conductor.audit(run, held.stage, run.stages[held.stage].attempts, "gate_rejected",
                        pipe=pipe, gate=chosen, by=by, reason=reason)  # fmt: skip
        if held.branch is None:
            return transitions.Next(ended=True), run
        spec = pipeline.stage(held.stage)
        why = f"rejected by {by}: {reason}"
        return fanout.settle_gate(conductor, run, pipe, spec, held.branch, approved=False,
                                  reason=why), run  # fmt: skip

    decision, run = conductor.store.transact(run_id, mutate)
    if decision is None:
        return False
    conductor.carry_out(run, decision, pipeline)
    return True


def time_out(conductor: Conductor, run_id: str, now: float) -> dict[str, str]:
    """Act on the run's gates whose timeout fell (the reconciler's part): each id with
    what happened, `expired` (the run failed; a branch's gate: the branch) or `escalated`."""
    pipeline = conductor.pipeline_of(conductor.store.get(run_id))

    def mutate(
        run: RunRecord, pipe: Any
    ) -> tuple[tuple[dict[str, str], list[transitions.Next]], RunRecord]:
        acted, decisions = {}, []
        for name, gate in gates.overdue(run, now).items():
            what = gates.time_out(run, name, now=now)
            if what is None:
                continue
            acted[name] = what
            conductor.audit(run, gate.stage, run.stages[gate.stage].attempts,
                            f"gate_{what}", pipe=pipe, gate=name)  # fmt: skip
            if what == "expired" and gate.branch is not None:
                decisions.append(fanout.settle_gate(
                    conductor, run, pipe, pipeline.stage(gate.stage), gate.branch,
                    approved=False, reason=f"gate {name}: {gate.reason}",
                ))  # fmt: skip
        return (acted, decisions), run

    (acted, decisions), run = conductor.store.transact(run_id, mutate)
    for decision in decisions:
        conductor.carry_out(run, decision, pipeline)
    if run.status.is_terminal:
        conductor.store.retire(run)
    return dict(acted)

"""Gates from the conductor's side: approve, reject and time out a run's gates, each in one
transaction on the run record, each applied once (`orchestrator.core.gates` is the pure part:
what a gate is, when it holds a run, what an approval or a rejection changes)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.core import gates, handoffs, keys, transitions
from orchestrator.core.models import RunRecord

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor


def approve(
    conductor: Conductor, run_id: str, gate: str | None = None, *, by: str,
    edit: Mapping[str, Any] | None = None,
) -> gates.Approval:  # fmt: skip
    """Approve a gate of the run (`gate`, or its one pending gate), with `edit` replacing
    the gated stage's output (checked against its schema; audited). Says whether it was
    applied (not if the gate was approved before: nothing changes) and the stage queued.

    Raises:
        RunStateError: no such gate, it was rejected or expired, or the run has ended.
        PipelineError: `edit` does not fit the stage's output schema, or edits a diff gate.
    """
    run = conductor.store.get(run_id)
    chosen = gates.choose(run, gate)
    pipeline = conductor.pipeline_of(run)
    spec = pipeline.stage(run.gates[chosen].stage)
    edited = None if edit is None else gates.checked_edit(spec, run.gates[chosen], edit)
    outputs = keys.outputs(run_id)

    def mutate(run: RunRecord, pipe: Any) -> tuple[transitions.Next | None, RunRecord]:
        if not gates.approve(run, chosen, by=by, edited=edited is not None, now=time.time()):
            return None, run
        output = conductor.store.output(run_id, spec.output_key) or {}
        if edited is not None:
            pipe.hset(outputs, f"{spec.output_key}.proposed", transitions.compact(output))
            pipe.hset(outputs, spec.output_key, transitions.compact(edited))
        conductor.audit(run, spec.name, run.stages[spec.name].attempts, "gate_approved",
                    pipe=pipe, gate=chosen, by=by, edit=edited)  # fmt: skip
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
    with `reason`. False if the gate was rejected before (nothing changes).

    Raises:
        RunStateError: no such gate, it was approved or expired, or the run has ended.
    """

    def mutate(run: RunRecord, pipe: Any) -> tuple[bool, RunRecord]:
        chosen = gates.choose(run, gate)
        if not gates.reject(run, chosen, by=by, reason=reason, now=time.time()):
            return False, run
        stage = run.gates[chosen].stage
        conductor.audit(run, stage, run.stages[stage].attempts, "gate_rejected", pipe=pipe,
                    gate=chosen, by=by, reason=reason)  # fmt: skip
        return True, run

    done, run = conductor.store.transact(run_id, mutate)
    if done:
        conductor.store.retire(run)
    return bool(done)


def time_out(conductor: Conductor, run_id: str, now: float) -> dict[str, str]:
    """Act on the run's gates whose timeout fell (the reconciler's part): each id with
    what happened, `expired` (the run failed) or `escalated`."""

    def mutate(run: RunRecord, pipe: Any) -> tuple[dict[str, str], RunRecord]:
        acted = {}
        for name, gate in gates.overdue(run, now).items():
            what = gates.time_out(run, name, now=now)
            if what is not None:
                acted[name] = what
                conductor.audit(run, gate.stage, run.stages[gate.stage].attempts,
                            f"gate_{what}", pipe=pipe, gate=name)  # fmt: skip
        return acted, run

    acted, run = conductor.store.transact(run_id, mutate)
    if run.status.is_terminal:
        conductor.store.retire(run)
    return dict(acted)

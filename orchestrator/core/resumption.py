"""Resuming an ended run: from its failed, cancelled or rejected stage (or one named), with
the pipeline version it pinned or a newer one of the same pipeline, and a raised budget. One
transaction on the run record checks it has ended, refreshes the stages from the target on,
drops their gates and queues the target (its branches too, their attempts carrying on, so
session ids stay unique); then the dropped outputs go and the target is sent."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from orchestrator.core import fanin, gates, judging, keys, spend, transitions
from orchestrator.core.errors import PipelineError, RunStateError
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.models import RunRecord, RunStatus, StageStatus

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor
    from orchestrator.core.pipeline import Pipeline
    from orchestrator.core.runbudget import RunBudget


def resume(
    conductor: Conductor,
    run_id: str,
    from_stage: str | None = None,
    *,
    pipeline: Pipeline | None = None,
    budget: RunBudget | None = None,
) -> str:
    """Run an ended run again from its failed or cancelled stage (or `from_stage`), keeping
    every output recorded before it, with the pipeline version it pinned or, given
    `pipeline` (another version of the same pipeline), with that one, pinned from now on;
    with `budget`'s limits in place of its budget's (`spend.resume_budget`). Returns the
    stage enqueued.

    Raises:
        RunStateError: the run has not ended, or there is nothing to resume, or its budget
            stopped it and `budget` is not given.
        PipelineError: `pipeline` has another name, or no stage `from_stage`.
    """
    recorded = conductor.store.get(run_id)
    if pipeline is not None and pipeline.name != recorded.pipeline:
        raise PipelineError(
            f"run {run_id} runs pipeline {recorded.pipeline!r}, not {pipeline.name!r}"
        )
    repin = pipeline is not None and pipeline.digest != recorded.pipeline_hash
    pipeline = pipeline or conductor.pipeline_of(recorded)
    names = [stage.name for stage in pipeline.stages]
    if from_stage is not None:
        pipeline.stage(from_stage)

    def mutate(run: RunRecord, pipe: Any) -> RunRecord:
        if not run.status.is_terminal:
            raise RunStateError(f"run {run_id} is still {run.status.value}; cancel it first")
        if repin:
            transitions.repin(run, pipe, pipeline)
        spend.resume_budget(conductor.store.redis, run, pipe, budget)
        now = time.time()
        for name, record in run.stages.items():
            leases = [record.lease_until or 0] + [
                branch.lease_until or 0 for branch in (record.fan_in.branches.values()
                if record.fan_in is not None else []) if branch.status == BranchStatus.RUNNING
            ]  # fmt: skip
            left_s = max(leases) - now
            if record.status == StageStatus.RUNNING and left_s > 0:
                # Cancelled, but its execution has not stopped yet: it would run beside
                # the resumed one.
                raise RunStateError(
                    f"stage {name} of run {run_id} is still stopping; resume the run once "
                    f"it has (within {left_s:.0f}s)"
                )
        target = from_stage or gates.resume_point(run) or transitions.resume_point(run, names)
        previous = run.stages.get(target)
        for name in names[names.index(target) :]:
            run.stages[name] = transitions.fresh(run.stages.get(name))
        for dropped in gates.forget(run, names[names.index(target) :]):
            pipe.hdel(keys.run(run.id), keys.gate_field(dropped))
        run.stages[target].status, run.stages[target].queued_at = (
            StageStatus.QUEUED,
            time.time(),
        )
        fanin.open_fan(run.stages[target], pipeline.stage(target),
                        previous.fan_in if previous else None)  # fmt: skip
        run.status, run.reason, run.current_stage = RunStatus.QUEUED, None, target
        return run

    run: RunRecord = conductor.store.transact(run_id, mutate)
    target = run.current_stage
    assert target is not None
    redo = [pipeline.stage(name).output_key for name in names[names.index(target) :]]
    conductor.store.revive(run, drop_outputs=redo)
    judging.offer_again(conductor.store, run.id, pipeline, target)
    conductor.audit(run, target, 0, "run_resumed", from_stage=target,
                pipeline_hash=run.pipeline_hash)  # fmt: skip
    conductor.send(run_id, pipeline.name, pipeline.stage(target), run.stages[target].iteration)
    return target

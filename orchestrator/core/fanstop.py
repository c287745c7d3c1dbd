"""A fan-out stage stopped whole because its run ended (its budget stopped it, say): every
branch not yet ended is marked stopped, none starts later, none is joined.

What keeps the branches from going on is the run's status, read by every branch transaction
(`orchestrator.core.fanout`): once the run has failed, a delivered branch is dropped
(`begin_branch`), a running one's heartbeat and safe points find it no longer holds its branch
(`renew_branch`, `hold_branch` answer LOST: the worker removes its sandboxes and interrupts
it), and its end is never recorded (`complete_branch` answers LOST: no output stored, no
join, no next stage). `stop_branches` writes the same on the branches' own records, so that
`status` shows why each ended. `fail_from_branch` is how an execution of a branch ends its
whole run (a refused model call or hand-off: the run's budget is the run's, not the
branch's); `Conductor.fail` (the reconciler's wall-time stop, a stage's failure) stops the
branches of the stage it fails as well.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from orchestrator.core.fanin import BranchStatus, FanIn
from orchestrator.core.models import RunRecord, RunStatus, StageStatus

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor
    from orchestrator.core.execution import StageFigures


def stop_branches(fan: FanIn, reason: str, now: float) -> list[str]:
    """Mark every branch that has not ended as failed, `stopped: <reason>` (a running one's
    execution is told by its next heartbeat); returns them. Nothing is selected or joined."""
    stopped = [name for name, branch in fan.branches.items() if not branch.status.ended]
    for name in stopped:
        branch = fan.branches[name]
        branch.status, branch.error = BranchStatus.FAILED, f"stopped: {reason}"
        branch.finished_at, branch.owner, branch.lease_until = now, None, None
    fan.ended += len(stopped)
    return stopped


def fail_from_branch(
    conductor: Conductor, run_id: str, stage: str, branch: str, error: str, *, owner: str,
    figures: StageFigures | None = None,
) -> bool:  # fmt: skip
    """End the whole run from an execution of one of its branches, in one transaction, if
    `owner` still holds that branch of a run that goes on: the branch failed with `error`,
    every other branch stopped, the stage and the run failed with `error` (the run's reason
    `<stage>: <error>`). What the execution spent (`figures`: its audit entries) is kept
    either way. Returns whether it did."""

    def mutate(run: RunRecord, pipe: Any) -> RunRecord | None:
        conductor.record_execution(run, pipe, figures)
        record = run.stages.get(stage)
        fan = record.fan_in if record is not None else None
        held = fan is not None and branch in fan.branches and fan.branches[branch].owner == owner
        if run.status.is_terminal or not held or record is None or fan is None:
            return None
        now = time.time()
        stop_branches(fan, error, now)
        fan.branches[branch].error = error
        record.status, record.finished_at, record.error = StageStatus.FAILED, now, error
        record.lease_until = None
        run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{stage}: {error}", None
        conductor.audit(run, stage, fan.branches[branch].attempts, "stage_failed", pipe=pipe,
                        branch=branch, error=error)  # fmt: skip
        return run

    run: RunRecord | None = conductor.store.transact(run_id, mutate)
    if run is None:
        return False
    conductor.store.retire(run)
    return True

"""A run's hand-offs, counted against its budget's `handoffs` limit (the swarm design's
`max_handoffs`).

A hand-off is the run handing its work to a new agent session:

    what                                                            counts
    a stage's end queuing the next stage (also once its gate is     1
    approved, or once a fan-out's join selected a branch)
    a looped stage queued for its next iteration                    1
    a fan-out stage queued                                          1 per branch
    a stage's agent starting a subagent (`delegate`), any depth     1 per child

Not hand-offs: the first stage at enqueue, a resume, and a retry, redelivery or re-send of the
same execution (they hand nothing to anyone new).

Every hand-off is counted inside a run transaction (`RunStore.transact`), in the spend hash
beside the run (`orchestrator.core.spend`, field `handoffs`): the transaction reads the count
and queues its increment, and since each transaction that counts one is fenced by the run
record's version, the check and the count are one atomic step however many executions of the
run hand off at once. A hand-off past the limit is not made: the run fails in that same
transaction with `run budget exceeded: handoffs: …`, the spend is marked exceeded (so every
other execution of the run is refused at its next model call), and nothing is queued.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core import keys
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.spend import EXCEEDED, HANDOFFS, STOPPED, BudgetExceeded
from orchestrator.core.store import RunStore
from orchestrator.core.transitions import Next


def counted(redis: Any, run: RunRecord, pipe: Any, decision: Next, completed: str) -> Next:
    """Within the transaction that made `decision` after `completed`: count the hand-offs it
    makes (its queued stage, or each branch of it). Refused (past the limit, or the run's
    spend already stopped by a limit), the stage is not queued and the run fails instead:
    `Next(ended=True)`."""
    if decision.send is None or run.budget is None:
        return decision
    queued = run.stages[decision.send]
    branches = len(queued.fan_in.branches) if queued.fan_in is not None else 0
    refused = _count(redis, run, pipe, max(1, branches), decision.send if branches else None)
    if refused is None:
        return decision
    error = STOPPED + refused
    if decision.send == completed:  # a loop's next iteration: the stage ends failed
        queued.status, queued.error = StageStatus.FAILED, error
    else:
        queued.status, queued.queued_at, queued.fan_in = StageStatus.PENDING, None, None
    run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{completed}: {error}", None
    return Next(ended=True)


def mapped(redis: Any, run: RunRecord, pipe: Any, stage: str, items: int) -> str | None:
    """Within the transaction that makes a `map` stage's branches: the hand-offs of its
    branches beyond the one counted when the stage was queued (it had no branches yet). The
    reason they are refused, else None."""
    if run.budget is None or items <= 1:
        return None
    refused = _count(redis, run, pipe, items - 1, stage)
    return None if refused is None else STOPPED + refused


def delegated(store: RunStore, run_id: str) -> None:
    """Count one subagent started by an execution of the run, in a run transaction.

    Raises:
        BudgetExceeded: the run's budget refuses it (the reason); the spend is marked, and
            the execution fails with it.
    """

    def mutate(run: RunRecord, pipe: Any) -> str | None:
        if run.budget is None or run.status.is_terminal:  # an ended run's stage is stopping
            return None
        return _count(store.redis, run, pipe, 1, None)

    refused: str | None = store.transact(run_id, mutate)
    if refused is not None:
        raise BudgetExceeded(refused)


def _count(redis: Any, run: RunRecord, pipe: Any, count: int, fan: str | None) -> str | None:
    """Queue `count` hand-offs on `pipe`, or the reason they are refused (the spend marked
    exceeded by the same transaction). `fan`: the fan-out stage whose branches they are."""
    assert run.budget is not None
    spend = keys.spend(run.id)
    stopped, made = redis.hmget(spend, EXCEEDED, HANDOFFS)
    if stopped:
        return str(stopped)
    made, limit = int(made or 0), run.budget.handoffs
    if limit is not None and made + count > limit:
        wanted = f" + {count} for the branches of {fan}" if fan else ""
        reason = f"handoffs: {made} made{wanted}, limit {limit}"
        pipe.hsetnx(spend, EXCEEDED, reason)
        return reason
    pipe.hincrby(spend, HANDOFFS, count)
    return None

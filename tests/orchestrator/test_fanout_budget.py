"""A run budget exceeded in the middle of a fan-out, on a real Redis: the run fails with the
reason in one transaction, no queued branch starts later, a running branch's heartbeat and safe
points find it must stop, its end is never recorded, nothing is joined and no next stage is
queued (nothing is published)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from orchestrator.core import fanout, fanstop, keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import Completion, Hold, StartAction
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import QueueConfig
from orchestrator.core.spend import BudgetExceeded, SpendLedger
from tests.orchestrator.test_fanout_conductor import (
    ISSUE,
    LEASE_S,
    PIPELINE,
    begin,
    fix_result,
    headers,
)
from tests.orchestrator.test_handoffs import conductor as conductor  # the fixture
from tests.orchestrator.test_handoffs import ran


def mid_fan_out(conductor: Conductor, budget: RunBudget) -> str:
    """A run of `wide` with `budget` whose `fix` fans out: b1 and b2 running, b3 queued."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE, budget=budget)
    ran(conductor, run_id, "reproduce", {"test_files": ["t.py"]})
    for n in (1, 2):
        assert begin(conductor, run_id, f"b{n}", f"w{n}").action == StartAction.RUN
    return run_id


def nothing_goes_on(conductor: Conductor, client: redis.Redis, run_id: str, reason: str) -> None:
    """What a run failed mid-fan-out must show, whichever way it was stopped."""
    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (RunStatus.FAILED, f"fix: {reason}")
    fix = run.stages["fix"]
    assert fix.status == StageStatus.FAILED and fix.fan_in is not None
    assert fix.fan_in.branches["b3"].status == BranchStatus.FAILED
    assert fix.fan_in.branches["b3"].error == f"stopped: {reason}"
    # The queued branch, delivered later, does not start.
    assert begin(conductor, run_id, "b3", "w3").action == StartAction.DROP
    # The running branch's heartbeat and its fence find it must stop (the worker then removes
    # its sandboxes and interrupts it); its end, if it comes, is not recorded.
    renewed = fanout.renew_branch(conductor, run_id, "fix", "b2", owner="w2", lease_s=LEASE_S)
    assert renewed == Hold.LOST
    assert fanout.hold_branch(conductor, run_id, "fix", "b2", owner="w2") == Hold.LOST
    late = fanout.complete_branch(conductor, run_id, "fix", "b2",
                                  fix_result(run_id, "two", True, 10), owner="w2")  # fmt: skip
    assert late == Completion.LOST
    # Nothing joined, no output, nothing after: the pr stage never queued, no message for it.
    after = conductor.store.get(run_id).stages["fix"]
    assert after.fan_in is not None and not after.fan_in.joined and after.fan_in.selected is None
    assert not client.hexists(keys.outputs(run_id), "fix")
    assert not client.hexists(keys.outputs(run_id), "fix#b2")
    assert run.stages["pr"].status == StageStatus.PENDING
    assert headers(client, "baton.wide.pr") == []
    assert run_id not in conductor.store.active()


def test_a_branch_whose_call_the_budget_refuses_fails_the_run_and_stops_every_branch(
    conductor: Conductor,
    redis_client: redis.Redis,
) -> None:
    ledger = SpendLedger(redis_client)
    run_id = mid_fan_out(conductor, RunBudget(calls=2))

    def call(branch: str) -> None:
        ledger.reserve(run_id, RunBudget(calls=2), tokens=10, cost_usd=None, model="m",
                       started_at=time.time())  # fmt: skip

    call("b1")
    call("b2")
    with pytest.raises(BudgetExceeded) as refused:
        call("b1")  # b1's next call crosses the limit: b1's execution ends the run
    reason = f"run budget exceeded: {refused.value}"
    assert fanstop.fail_from_branch(conductor, run_id, "fix", "b1", reason, owner="w1")

    nothing_goes_on(conductor, redis_client, run_id, reason)
    assert reason == "run budget exceeded: model calls: 2 made, limit 2"
    with pytest.raises(BudgetExceeded, match="model calls: 2 made"):
        call("b2")  # b2's next call is refused too, before its heartbeat even beats
    # Done once: a second branch failing the run, or a lost execution of b1, changes nothing.
    assert not fanstop.fail_from_branch(conductor, run_id, "fix", "b2", reason, owner="w2")


@pytest.mark.parametrize("how", ["reconciler", "conductor.fail"])
def test_a_run_failed_past_its_wall_time_mid_fan_out_stops_every_branch(
    conductor: Conductor,
    redis_client: redis.Redis,
    how: str,
) -> None:
    run_id = mid_fan_out(conductor, RunBudget(wall_s=60))
    stop: Callable[[], None]
    if how == "reconciler":
        stop = lambda: Reconciler(conductor, QueueConfig()).sweep(now=time.time() + 90)  # noqa: E731
    else:
        stop = lambda: conductor.fail(run_id, "fix", "run budget exceeded: wall time")  # noqa: E731
    stop()

    reason = conductor.store.get(run_id).reason or ""
    assert reason.startswith("fix: run budget exceeded: wall time"), reason
    nothing_goes_on(conductor, redis_client, run_id, reason.removeprefix("fix: "))

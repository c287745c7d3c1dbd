"""A run's budget under Baton's Redis users (k8s/baton/redis-users.acl): a worker reserves and
reconciles model calls (the spend's script, cost included), counts hand-offs and stops a run;
`cli` and `baton serve` resume a run its budget stopped and approve a gate that hands off.
Each runs the real code, as its own user, and is refused nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestrator.core import handoffs, keys
from orchestrator.core.models import Issue, IssueSource, RunRecord, RunStatus, StageRecord
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import BudgetExceeded, SpendLedger, resume_budget
from orchestrator.core.store import RunStore
from orchestrator.core.transitions import Next
from testkit.services import RedisServer
from tests.integration.test_redis_acl import acl_redis as acl_redis  # the fixture

BUDGET = RunBudget(calls=1, cost_usd=1.0, handoffs=1)


@pytest.fixture
def created(acl_redis: RedisServer) -> Iterator[str]:
    """A run with `BUDGET`, created as the worker user creates runs."""
    client = acl_redis.client("worker", decode_responses=True)
    run = RunRecord(id="20261202-000000-acl001", pipeline="p", repo="/r", commit="c",
                    idempotency_key="acl", issue=Issue(source=IssueSource.TEXT, title="t"),
                    budget=BUDGET, stages={"a": StageRecord(), "b": StageRecord()})  # fmt: skip
    RunStore(client).create(run, force=True)
    yield run.id
    admin = acl_redis.client()
    for key in admin.scan_iter(match=f"{keys.run(run.id)}*"):
        admin.delete(key)
    client.close()


def queue_b(run: RunRecord) -> Next:
    """A transition that queues stage b (as `transitions.decide` does)."""
    run.stages["b"].status = run.stages["b"].status.QUEUED
    return Next(send="b")


@pytest.mark.parametrize("role", ["worker", "serve", "cli"])
def test_every_role_that_changes_runs_keeps_their_budgets(
    role: str, acl_redis: RedisServer, created: str
) -> None:
    client: redis.Redis = acl_redis.client(role, decode_responses=True)
    store, ledger = RunStore(client), SpendLedger(client)
    try:
        if role == "worker":  # a model call reserved, costed, reconciled; the next refused
            kept = ledger.reserve(created, BUDGET, tokens=100, cost_usd=0.001, model="m",
                                  started_at=0, now=1)  # fmt: skip
            ledger.reconcile(created, kept, tokens=150, cost_usd=0.002)
            handoffs.delegated(store, created)  # a subagent: the one hand-off of the budget
            with pytest.raises(BudgetExceeded):
                ledger.reserve(created, BUDGET, tokens=1, cost_usd=0.0, model="m",
                               started_at=0, now=1)  # fmt: skip
        else:
            ledger.stop(created, "wall time: 99s since the run began, limit 60s")

        # A transition's hand-off counted (or refused, the spend marked) in the run's own
        # transaction, and a resume taking the stop mark away.
        def hand_off(run: RunRecord, pipe: Any) -> Next:
            return handoffs.counted(client, run, pipe, queue_b(run), "a")

        def resume(run: RunRecord, pipe: Any) -> None:
            resume_budget(client, run, pipe, RunBudget(calls=5))

        store.transact(created, hand_off)
        store.transact(created, resume)
    finally:
        client.close()
    admin = acl_redis.client(decode_responses=True)
    try:
        spend = SpendLedger(admin).spend(created)
        run = RunStore(admin).get(created)
    finally:
        admin.close()
    # The transition was refused (the spend was marked), the run failed; the resume took the
    # mark away and raised the limit.
    assert (run.status, run.budget) == (RunStatus.FAILED, BUDGET.over(RunBudget(calls=5)))
    assert spend.exceeded is None
    assert (spend.calls, spend.handoffs) == ((1, 1) if role == "worker" else (0, 0))

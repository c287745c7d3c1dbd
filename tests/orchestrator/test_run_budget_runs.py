"""A run's budget on the run: fixed at enqueue from the pipeline's `[run_budget]` and the
run's own limits, kept in the store, and its wall time enforced by the reconciler."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from orchestrator.core import keys
from orchestrator.core.conductor import Conductor, Hold
from orchestrator.core.models import Issue, IssueSource, RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import QueueConfig
from orchestrator.core.spend import BudgetExceeded, SpendLedger
from orchestrator.core.store import RunStore, run_fields

ISSUE = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart")
QUEUE = QueueConfig(stuck_after_s=60, reconcile_every_s=30)
OWNER = "host:1:t"


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QUEUE)
    yield Conductor(store, dispatcher)
    dispatcher.close()


def submitted(conductor: Conductor, budget: RunBudget | None, **pipeline_budget: float) -> str:
    pipeline = load_pipeline("fixer")
    if pipeline_budget:
        pipeline = pipeline.model_validate({**pipeline.table, "run_budget": pipeline_budget})
    run_id, _ = conductor.submit(
        ISSUE, repo="/r", commit="c", pipeline=pipeline, budget=budget, force=True
    )
    return run_id


def test_the_run_budget_is_the_pipelines_with_the_runs_limits_in_place(
    conductor: Conductor,
) -> None:
    run_id = submitted(conductor, RunBudget(calls=5), calls=40, tokens=10_000)
    assert conductor.store.get(run_id).budget == RunBudget(calls=5, tokens=10_000)
    assert conductor.store.get(submitted(conductor, None)).budget is None
    assert conductor.store.get(submitted(conductor, None, wall_s=60)).budget == RunBudget(wall_s=60)


def test_the_reconciler_stops_a_run_past_its_wall_time(conductor: Conductor) -> None:
    run_id = submitted(conductor, RunBudget(wall_s=60))
    within = submitted(conductor, RunBudget(wall_s=600))
    for run in (run_id, within):
        conductor.begin(run, "triage", owner=OWNER, lease_s=600, max_interrupted=3)
    later = time.time() + 90

    sweep = Reconciler(conductor, QUEUE).sweep(now=later)

    assert list(sweep.failed) == [run_id]
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason is not None
    assert run.reason.startswith("triage: run budget exceeded: wall time: 9")
    assert run.reason.endswith("s since the run began, limit 60.0s")
    # The running execution is told at its next safe point, and no call of the run goes out.
    assert conductor.hold(run_id, "triage", owner=OWNER) == Hold.LOST
    with pytest.raises(BudgetExceeded, match="wall time"):
        SpendLedger(conductor.store.redis).reserve(
            run_id, RunBudget(), tokens=1, cost_usd=None, model="m", started_at=time.time()
        )
    assert conductor.store.get(within).status == RunStatus.RUNNING


def test_a_record_written_before_budgets_and_fan_outs_is_read_without_them(
    conductor: Conductor, store: RunStore
) -> None:
    """A run the previous version wrote (its `meta` has no `budget`, its stages no `fan_in`,
    its spend, if any, no `handoffs`) is read by this one as a run without a budget."""
    run = store.get(submitted(conductor, None))
    fields = run_fields(run)
    meta = json.loads(fields["meta"])
    del meta["budget"]
    old = {**fields, "meta": json.dumps(meta)}
    for name, value in fields.items():
        if name.startswith("stage:"):
            stage = json.loads(value)
            del stage["fan_in"]
            old[name] = json.dumps(stage)
    store.redis.delete(keys.run(run.id))
    store.redis.hset(keys.run(run.id), mapping=old)
    store.redis.hset(keys.spend(run.id), mapping={"calls": "2", "tokens": "40"})

    read = store.get(run.id)
    assert read.budget is None and all(stage.fan_in is None for stage in read.stages.values())
    assert read.stages == run.stages
    assert SpendLedger(store.redis).spend(run.id).handoffs == 0

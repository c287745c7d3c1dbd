"""A run's hand-offs against its budget, on a real Redis: each transition that queues a stage,
a loop's next iteration, each branch of a fan-out and each subagent counted in the run's spend
by the run's own transaction; the one past the limit is not made and the run fails with the
reason. A run its budget stopped is resumed with a raised budget, its spend carried over."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from orchestrator.core import handoffs, keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import RunStateError
from orchestrator.core.execution import StageResult, StartAction
from orchestrator.core.models import Issue, IssueSource, RunStatus, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import QueueConfig
from orchestrator.core.spend import BudgetExceeded, SpendLedger
from orchestrator.core.store import RunStore
from tests.orchestrator.test_fanout_conductor import PIPELINE as WIDE
from tests.orchestrator.test_gates_conductor import PROPOSED, acts, gated

ISSUE = Issue(source=IssueSource.TEXT, title="Totals are off by one")
SCHEMAS = "orchestrator.pipelines.fixer.schemas"
HOPS = Pipeline.model_validate(
    {"name": "hops", "stages": [
        {"name": "plan", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Plan"},
        {"name": "fix", "instruction": "{plan}", "output_schema": f"{SCHEMAS}:Fix",
         "loop": {"until": "tests_passed", "max_iterations": 3}},
        {"name": "pr", "instruction": "{fix}", "output_schema": f"{SCHEMAS}:Plan"},
    ]}
)  # fmt: skip
PLAN = {"approach": "a", "steps": ["s"], "files_to_change": ["a.py"], "test_command": "pytest"}
FIX = {"summary": "s", "files_changed": ["a.py"], "test_command": "pytest", "tests_passed": False}


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def queued_tasks(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)][::-1]


def ran(conductor: Conductor, run_id: str, stage: str, output: dict[str, object]) -> None:
    """One execution of `stage`: claimed and recorded with `output`."""
    start = conductor.begin(run_id, stage, owner="w", lease_s=30, max_interrupted=3)
    assert start.action == StartAction.RUN, start.action
    conductor.complete(run_id, stage, StageResult(output), owner="w")


def test_each_stage_queued_and_each_iteration_is_a_handoff_and_the_one_past_the_limit_fails(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=HOPS,
                                 budget=RunBudget(handoffs=2))  # fmt: skip
    ran(conductor, run_id, "plan", PLAN)  # plan → fix: 1
    ran(conductor, run_id, "fix", FIX)  # fix → fix, iteration 2: 2
    assert SpendLedger(redis_client).spend(run_id).handoffs == 2
    assert queued_tasks(redis_client, "baton.hops.fix") == [f"{run_id}.fix", f"{run_id}.fix.2"]

    ran(conductor, run_id, "fix", FIX)  # iteration 3 would be the third

    run = conductor.store.get(run_id)
    reason = "run budget exceeded: handoffs: 2 made, limit 2"
    assert (run.status, run.reason) == (RunStatus.FAILED, f"fix: {reason}")
    assert (run.stages["fix"].status, run.stages["fix"].error) == (StageStatus.FAILED, reason)
    assert run.stages["pr"].status == StageStatus.PENDING
    assert queued_tasks(redis_client, "baton.hops.fix") == [f"{run_id}.fix", f"{run_id}.fix.2"]
    spend = SpendLedger(redis_client).spend(run_id)
    assert (spend.handoffs, spend.exceeded) == (2, "handoffs: 2 made, limit 2")
    assert run_id not in conductor.store.active()


def test_a_fan_out_is_a_handoff_per_branch_and_none_is_sent_past_the_limit(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=WIDE,
                                 budget=RunBudget(handoffs=2))  # fmt: skip
    ran(conductor, run_id, "reproduce", {"test_files": ["t.py"]})

    run = conductor.store.get(run_id)
    assert run.reason == (
        "reproduce: run budget exceeded: handoffs: 0 made + 3 for the branches of fix, limit 2"
    )
    assert run.stages["fix"].status == StageStatus.PENDING and run.stages["fix"].fan_in is None
    assert queued_tasks(redis_client, "baton.wide.fix") == []
    assert SpendLedger(redis_client).spend(run_id).handoffs == 0


def test_subagents_count_in_the_same_spend_and_the_one_past_the_limit_is_refused(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=HOPS,
                                 budget=RunBudget(handoffs=2))  # fmt: skip
    ran(conductor, run_id, "plan", PLAN)  # 1
    handoffs.delegated(conductor.store, run_id)  # 2
    with pytest.raises(BudgetExceeded, match=r"^handoffs: 2 made, limit 2$"):
        handoffs.delegated(conductor.store, run_id)
    # The spend is marked: the stage's next model call is refused, so the stage fails with it.
    with pytest.raises(BudgetExceeded, match="handoffs: 2 made"):
        SpendLedger(redis_client).reserve(
            run_id, RunBudget(), tokens=1, cost_usd=None, model="m", started_at=0, now=1
        )
    # A run without a budget counts nothing.
    free, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=HOPS, force=True)
    handoffs.delegated(conductor.store, free)
    assert not redis_client.exists(keys.spend(free))


def test_a_run_its_budget_stopped_resumes_only_with_a_raised_budget_and_its_spend_carried_over(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    ledger = SpendLedger(redis_client)
    budget = RunBudget(calls=1, handoffs=5)
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=HOPS, budget=budget)
    conductor.begin(run_id, "plan", owner="w", lease_s=30, max_interrupted=3)

    def call() -> None:
        ledger.reserve(run_id, conductor.store.get(run_id).budget or RunBudget(), tokens=10,
                       cost_usd=None, model="m", started_at=0, now=1)  # fmt: skip

    call()
    with pytest.raises(BudgetExceeded) as refused:
        call()
    conductor.fail(run_id, "plan", f"run budget exceeded: {refused.value}", owner="w")

    with pytest.raises(
        RunStateError, match=r"stopped by its budget \(model calls: 1 made, limit 1"
    ):
        conductor.resume(run_id)
    assert conductor.resume(run_id, budget=RunBudget(calls=2)) == "plan"

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.QUEUED and run.budget == RunBudget(calls=2, handoffs=5)
    assert (ledger.spend(run_id).calls, ledger.spend(run_id).exceeded) == (1, None)
    conductor.begin(run_id, "plan", owner="w2", lease_s=30, max_interrupted=3)
    call()  # the second call of the run: within the raised limit
    with pytest.raises(BudgetExceeded, match=r"^model calls: 2 made, limit 2$"):
        call()


def test_a_gates_approval_hands_off_and_past_the_limit_fails_the_run_instead(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=gated(),
                                 budget=RunBudget(handoffs=1))  # fmt: skip
    handoffs.delegated(conductor.store, run_id)  # the plan's subagent: the one hand-off
    ran(conductor, run_id, "plan", PROPOSED)  # parks: no hand-off yet

    approval = conductor.approve(run_id, by="ana")

    assert (approval.applied, approval.queued) == (True, None)
    run = conductor.store.get(run_id)
    assert run.reason == "plan: run budget exceeded: handoffs: 1 made, limit 1"
    assert run.stages["act"].status == StageStatus.PENDING and acts(redis_client) == []

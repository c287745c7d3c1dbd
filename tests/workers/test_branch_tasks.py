"""How the stage task settles an execution of one branch of a fan-out stage, through the real
conductor on Redis: a 429 puts that branch back on its queue alone, a failure ends that branch
(not the stage, not the run), a cancel stops it; its figures and pending audit entries are kept
whatever happens."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import Held, StageStart, StartAction
from orchestrator.core.fanin import BranchRecord, BranchStatus
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import ModelConfig, QueueConfig, RetryConfig
from orchestrator.core.store import RunStore
from tests.orchestrator.test_fanout_conductor import PIPELINE, fanned_out
from workers import tasks
from workers.errors import RateLimitedError, StageCancelledError, StageError
from workers.execution import Execution, WorkerServices
from workers.holding import holding

from .test_tasks import RetryRaised, TaskStandIn

OWNER = "h:1:R.fix.b2"


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def branch_execution(conductor: Conductor, run_id: str, branch: str = "b2") -> Execution:
    """An execution of `branch` of `fix` that has begun, made three model calls and has one
    audit entry not yet written."""
    held = holding(conductor, Held(run_id, "fix", branch), OWNER)
    start = held.begin(lease_s=30.0, max_interrupted=3)
    assert start.action == StartAction.RUN and start.run is not None
    services = WorkerServices(
        conductor=conductor,
        sandboxes=None,  # type: ignore[arg-type]
        publisher=None,  # type: ignore[arg-type]
        governor=None,
        model=ModelConfig(),
        retry=RetryConfig(rate_limit_jitter_s=0.5),
    )
    made = Execution(services, start.run, PIPELINE, PIPELINE.stage("fix"), attempt=start.attempt,
                     holding=held)  # fmt: skip
    made.usage.requests = 3
    made.audit([{"kind": "model_reply", "branch": "wide.fix.b2", "session": "s", "data": "{}"}])
    return made


def branch(conductor: Conductor, run_id: str, name: str = "b2") -> BranchRecord:
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None
    return fan.branches[name]


def kinds(conductor: Conductor, run_id: str) -> list[str]:
    return [entry["kind"] for entry in conductor.store.audit_log(run_id)]


def test_a_rate_limited_branch_goes_back_on_its_queue_alone(conductor: Conductor) -> None:
    run_id = fanned_out(conductor)
    sibling = holding(conductor, Held(run_id, "fix", "b1"), "h:2:R.fix.b1")
    sibling.begin(lease_s=30.0, max_interrupted=3)
    made = branch_execution(conductor, run_id)

    with pytest.raises(RetryRaised) as raised:
        tasks._settle(TaskStandIn(), made, RateLimitedError("429", 7.0))

    assert 7.0 <= raised.value.countdown <= 7.5
    waiting = branch(conductor, run_id)
    assert (waiting.status, waiting.rate_limit_retries, waiting.owner) == (
        BranchStatus.WAITING,
        1,
        None,
    )
    assert branch(conductor, run_id, "b1").status == BranchStatus.RUNNING
    run = conductor.store.get(run_id)
    assert (run.status, run.stages["fix"].status) == (RunStatus.RUNNING, StageStatus.RUNNING)
    assert {"model_reply", "branch_waiting"} <= set(kinds(conductor, run_id))


def test_a_branch_past_its_retry_budget_fails_alone(conductor: Conductor) -> None:
    run_id = fanned_out(conductor)
    made = branch_execution(conductor, run_id)
    made.run.stages["fix"].fan_in.branches["b2"].rate_limit_retries = 8  # type: ignore[union-attr]

    assert tasks._settle(TaskStandIn(), made, RateLimitedError("429")) == "failed"

    failed = branch(conductor, run_id)
    assert failed.status == BranchStatus.FAILED
    assert "gave up after 8 retries" in (failed.error or "")
    assert conductor.store.get(run_id).status == RunStatus.RUNNING


def test_a_failed_branch_ends_counted_with_what_it_cost_and_the_run_goes_on(
    conductor: Conductor,
) -> None:
    run_id = fanned_out(conductor)
    made = branch_execution(conductor, run_id)

    assert tasks._settle(TaskStandIn(), made, StageError("no change made")) == "failed"

    failed = branch(conductor, run_id)
    assert (failed.status, failed.error, failed.requests) == (
        BranchStatus.FAILED,
        "no change made",
        3,
    )
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None and (fan.ended, fan.joined) == (1, False)
    assert conductor.store.get(run_id).status == RunStatus.RUNNING
    log = conductor.store.audit_log(run_id)
    assert [e["kind"] for e in log if e["branch"] == "wide.fix.b2"][-2:] == [
        "model_reply",
        "branch_failed",
    ]
    assert json.loads(log[-1]["data"])["error"] == "no change made"


def test_a_branch_of_a_cancelled_run_is_recorded_stopped(conductor: Conductor) -> None:
    run_id = fanned_out(conductor)
    made = branch_execution(conductor, run_id)
    conductor.cancel(run_id)

    assert tasks._settle(TaskStandIn(), made, StageCancelledError()) == "cancelled"

    assert branch(conductor, run_id).status == BranchStatus.CANCELLED
    assert "model_reply" in kinds(conductor, run_id)


def test_a_branch_interrupted_too_often_fails_as_a_branch(conductor: Conductor) -> None:
    run_id = fanned_out(conductor)
    held = holding(conductor, Held(run_id, "fix", "b3"), OWNER)
    held.begin(lease_s=30.0, max_interrupted=3)

    tasks._not_run(held, StageStart(StartAction.EXHAUSTED))

    assert branch(conductor, run_id, "b3").status == BranchStatus.FAILED
    assert "interrupted 3 times" in (branch(conductor, run_id, "b3").error or "")
    assert conductor.store.get(run_id).stages["fix"].status == StageStatus.RUNNING

"""The reconciler against a real Redis and real Celery messages on the stage queues."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from orchestrator.core.conductor import Conductor
from orchestrator.core.models import Issue, IssueSource, StageStatus
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler, Repair, Sweep
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

from .test_conductor import queued_task_ids

ISSUE = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart")
QUEUE = QueueConfig(stuck_after_s=60, reconcile_every_s=30)


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QUEUE)
    yield Conductor(store, dispatcher)
    dispatcher.close()


def started(conductor: Conductor, *, lease_s: float) -> str:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline="fixer")
    conductor.begin(run_id, "triage", owner="host:1:t", lease_s=lease_s, max_interrupted=3)
    return run_id


def test_a_running_stage_whose_lease_lapsed_is_queued_again(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = started(conductor, lease_s=-1)
    redis_client.delete("baton.fixer.triage")

    repairs = Reconciler(conductor, QUEUE).sweep().repairs

    assert repairs == [Repair(run_id, "triage", "running")]
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.status, record.interrupted, record.owner) == (StageStatus.QUEUED, 1, None)
    assert queued_task_ids(redis_client, "baton.fixer.triage") == [f"{run_id}.triage"]


def test_a_running_stage_with_a_live_lease_is_left_alone(conductor: Conductor) -> None:
    run_id = started(conductor, lease_s=60)
    assert Reconciler(conductor, QUEUE).sweep().repairs == []
    assert conductor.store.get(run_id).stages["triage"].status == StageStatus.RUNNING


def test_a_queued_stage_is_sent_again_only_when_its_message_is_gone(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline="fixer")
    later = time.time() + 120
    reconciler = Reconciler(conductor, QUEUE)

    assert reconciler.sweep(now=later).repairs == []  # still in the queue
    redis_client.delete("baton.fixer.triage")
    assert reconciler.sweep(now=time.time()).repairs == []  # gone, but not for long enough
    assert reconciler.sweep(now=later).repairs == [Repair(run_id, "triage", "queued")]
    assert queued_task_ids(redis_client, "baton.fixer.triage") == [f"{run_id}.triage"]


def test_a_waiting_stage_long_past_its_retry_time_is_sent_again(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = started(conductor, lease_s=60)
    conductor.postpone(run_id, "triage", delay_s=5, reason="429")
    redis_client.delete("baton.fixer.triage")

    assert Reconciler(conductor, QUEUE).sweep(now=time.time() + 30).repairs == []
    assert Reconciler(conductor, QUEUE).sweep(now=time.time() + 120).repairs == [
        Repair(run_id, "triage", "waiting")
    ]


def test_an_ended_run_leaves_the_active_set(conductor: Conductor) -> None:
    run_id = started(conductor, lease_s=60)
    conductor.store.redis.hset(f"baton:run:{run_id}", "status", "done")

    assert Reconciler(conductor, QUEUE).sweep().repairs == []
    assert run_id not in conductor.store.active()


def test_only_one_process_sweeps_per_interval(conductor: Conductor) -> None:
    first = Reconciler(conductor, QUEUE).sweep_if_due(holder="a")
    second = Reconciler(conductor, QUEUE).sweep_if_due(holder="b")
    assert (first, second) == (Sweep(), None)


def test_the_broker_holds_queued_messages_and_recent_unacknowledged_ones_only(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    first, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline="fixer")
    [raw] = redis_client.lrange("baton.fixer.triage", 0, -1)
    message = json.loads(raw)
    now = time.time()
    unacked = [("t1", "run-a.fix", now - 5), ("t2", "run-b.fix", now - 600)]
    for tag, task_id, delivered_at in unacked:
        delivered = {**message, "headers": {**message["headers"], "id": task_id}}
        redis_client.hset("unacked", tag, json.dumps([delivered, "", "baton.fixer.fix"]))
        redis_client.zadd("unacked_index", {tag: delivered_at})
    redis_client.rpush("baton.fixer.fix", "not json", json.dumps({"no": "headers"}))

    held = conductor.dispatcher.held_task_ids(delivered_within_s=60)

    assert held == {f"{first}.triage": "baton.fixer.triage", "run-a.fix": "baton.fixer.fix"}

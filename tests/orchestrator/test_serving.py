"""Workers announce the queues they serve; anyone who may read runs tells a queue none serves,
and a run that waits on one (real Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from orchestrator.control.fleet import unserved_note, unserved_queue
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import Issue, IssueSource
from orchestrator.core.queue import Dispatcher
from orchestrator.core.serving import announce, servers, withdraw
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

ISSUE = Issue(source=IssueSource.TEXT, title="Nobody home")


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def test_a_queue_is_served_while_an_announcement_lasts_and_until_withdrawn(
    redis_client: redis.Redis,
) -> None:
    announce(redis_client, "w1@a", ["baton.p.x", "baton.p.y"], ttl_s=30)
    announce(redis_client, "w2@b", ["baton.p.x"], ttl_s=0.2)
    assert servers(redis_client, ["baton.p.x", "baton.p.y", "baton.p.z"]) == {
        "baton.p.x": 2, "baton.p.y": 1, "baton.p.z": 0,
    }  # fmt: skip

    time.sleep(0.3)  # w2's announcement lapsed (a worker killed: it never withdrew)
    withdraw(redis_client, "w1@a", ["baton.p.y"])

    assert servers(redis_client, ["baton.p.x", "baton.p.y"]) == {"baton.p.x": 1, "baton.p.y": 0}


def test_a_run_queued_where_no_worker_serves_says_so_and_what_to_start(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline="fixer")
    run = conductor.store.get(run_id)

    assert unserved_queue(conductor.store, run) == "baton.fixer.triage"
    assert unserved_note(run, "baton.fixer.triage") == (
        "no worker serves baton.fixer.triage, where triage waits: start one with "
        "`baton worker --pipeline fixer --stages triage`"
    )
    announce(redis_client, "w@a", ["baton.fixer.triage"], ttl_s=30)
    assert unserved_queue(conductor.store, run) is None

"""A worker holds no more messages than `BATON_QUEUE__ETA_TASK_LIMIT`, countdown retries
included: what waits stays in the queue, where other workers and the autoscaler see it.

Celery raises a worker's prefetch by one for every message with a countdown it takes (a 429's
retry is one), so without the limit a single worker empties the queue into its memory
(celery-flower.md, §2). A real worker subprocess and redis-server; the messages wait two
minutes, so none runs while the test looks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from orchestrator.core.queue import STAGE_TASK, celery_config
from orchestrator.core.settings import QueueConfig
from testkit import services

pytestmark = pytest.mark.integration

QUEUE = "prefetch-probe"
MESSAGES = 6
UNACKED = "unacked"
"""The hash kombu's Redis transport keeps the messages a worker took but has not acked in."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own: its queue and unacked hash hold nothing else."""
    with services.redis_server(tmp_path / "redis") as url:
        yield url


def held_after_taking(broker: str, logfile: Path, eta_task_limit: int) -> tuple[int, int]:
    """With `MESSAGES` countdown messages queued, a worker of concurrency 1 and this limit
    starts; once it has stopped taking them: (messages it holds, messages left in the queue)."""
    client = redis.Redis.from_url(broker)
    env = {"BATON_REDIS_URL": broker, "BATON_QUEUE__ETA_TASK_LIMIT": str(eta_task_limit)}
    with services.worker(env, [QUEUE], logfile=logfile):
        held = waiting = -1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = (client.hlen(UNACKED), client.llen(QUEUE))
            if now == (held, waiting) and held > 0:
                break  # the same twice, half a second apart: it has taken what it will
            held, waiting = now
            time.sleep(0.5)
    client.close()
    return held, waiting


def test_a_worker_holds_at_most_the_limit_of_countdown_messages(
    broker: str, tmp_path: Path
) -> None:
    sender = Celery(set_as_current=False)
    sender.config_from_object(celery_config(broker, QueueConfig()))
    for n in range(MESSAGES):
        sender.send_task(STAGE_TASK, args=(f"run-{n}", "triage"), queue=QUEUE, countdown=120)
    sender.close()

    held, waiting = held_after_taking(broker, tmp_path / "limited.log", eta_task_limit=2)
    assert (held, waiting) == (2, MESSAGES - 2)

    # The same messages (a warm shutdown put them back), a limit above their number: the
    # worker takes every one, which is what the limit is there to stop.
    held, waiting = held_after_taking(broker, tmp_path / "unlimited.log", eta_task_limit=100)
    assert (held, waiting) == (MESSAGES, 0)

"""The baseline of the overhead benchmark: a plain Celery chain of five no-op tasks, on the same
Redis and with the same worker settings as Baton (acks late, prefetch 1, prefork)."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from orchestrator.queue import celery_config
from orchestrator.settings import QueueConfig

URL = os.environ["BATON_REDIS_URL"]

app = Celery("bench-chain")
app.conf.update(celery_config(URL, QueueConfig()))
_client = redis.Redis.from_url(URL)


@app.task(name="bench.noop", bind=True)
def noop(self, previous: object, chain_id: str, index: int) -> int:  # type: ignore[no-untyped-def]
    """Record when the task started and when it ended; do nothing else."""
    started = time.time()
    _client.hset(
        f"bench:chain:{chain_id}", mapping={f"start:{index}": started, f"end:{index}": time.time()}
    )
    return index

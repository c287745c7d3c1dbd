"""Which queues a worker serves, told through Redis: every worker announces its queues now and
then, and anyone who may read runs can tell a queue no worker serves (`baton top`, `status`,
the web UI) without asking the workers — a broadcast that `baton serve`'s Redis user may not
send, since the same channel carries `shutdown`.

Each queue has a sorted set (`keys.consumers`) of the workers that serve it, each scored with the
time its announcement lapses; a worker that stops withdraws, one that dies lapses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from orchestrator.core import keys


def announce(redis: Any, worker: str, queues: Iterable[str], *, ttl_s: float) -> None:
    """`worker` serves `queues` for the next `ttl_s` seconds (or until it announces again)."""
    now = time.time()
    with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            key = keys.consumers(queue)
            pipe.zadd(key, {worker: now + ttl_s})
            pipe.zremrangebyscore(key, "-inf", now)
            # The set goes once the last announcement lapses: only ever lengthen its life.
            pipe.pexpire(key, int(ttl_s * 1000), nx=True)
            pipe.pexpire(key, int(ttl_s * 1000), gt=True)
        pipe.execute()


def withdraw(redis: Any, worker: str, queues: Iterable[str]) -> None:
    """`worker` no longer serves `queues` (it is stopping)."""
    with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.zrem(keys.consumers(queue), worker)
        pipe.execute()


def servers(redis: Any, queues: Iterable[str]) -> dict[str, int]:
    """How many workers serve each of `queues` now, read in one round trip."""
    names = list(dict.fromkeys(queues))
    now = time.time()
    with redis.pipeline(transaction=False) as pipe:
        for queue in names:
            pipe.zcount(keys.consumers(queue), now, "+inf")
        counts = pipe.execute()
    return {queue: int(count) for queue, count in zip(names, counts, strict=True)}

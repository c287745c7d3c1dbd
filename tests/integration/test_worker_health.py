"""The probes' health file says whether the worker still takes tasks: its consumer touches it at
every heartbeat, and stops when it loses Redis. A real worker subprocess and redis-server;
housekeeping rounds are ten minutes apart here, so no touch in the test comes from them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from testkit import services

pytestmark = pytest.mark.integration

HEARTBEAT_S = 1
"""The interval between the worker's heartbeats here (Celery's default, and Baton's, is 2 s;
shorter only to keep the test short)."""


def touches(health: Path, seconds: float) -> int:
    """How many times the file's modification time moved in `seconds`."""
    seen, moved = health.stat().st_mtime_ns, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = health.stat().st_mtime_ns
        moved += now != seen
        seen = now
    return moved


def test_the_health_file_is_fresh_while_the_consumer_runs_and_goes_stale_without_redis(
    tmp_path: Path,
) -> None:
    health = tmp_path / "alive"
    with services.redis_server(tmp_path / "redis") as url:
        env = {
            "BATON_REDIS_URL": url,
            "BATON_HEALTH_FILE": str(health),
            "BATON_QUEUE__RECONCILE_EVERY_S": "600",
        }
        with services.worker(
            env,
            ["health-probe"],
            logfile=tmp_path / "worker.log",
            options=["--heartbeat-interval", str(HEARTBEAT_S)],
        ) as worker:
            assert health.exists()
            assert touches(health, 4 * HEARTBEAT_S) >= 2

            redis.Redis.from_url(url).shutdown(nosave=True)
            time.sleep(HEARTBEAT_S)  # a heartbeat already on its way may still land
            assert touches(health, 4 * HEARTBEAT_S) == 0
            # Nothing left to see; a warm shutdown would wait for Redis first.
            os.killpg(worker.pid, signal.SIGKILL)

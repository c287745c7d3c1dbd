"""Saturation: how many whole fixer runs per minute this machine finishes, and where adding
worker processes stops helping.

The demo's fixer pipeline on the demo's sample repository, with its real Docker sandboxes
(search, fix and pr each start one; fix runs the tests in it before and after), against the
fake model answering at once, so that the machine (CPU, dockerd, Redis) is the limit. One
level per fleet size: a fresh redis-server, one worker with P pool processes serving every
stage queue (`baton worker -c P`), and 2 × P runs kept in flight (a new run is enqueued as one
ends) until 2 × P + 5 have been enqueued. Runs per minute are counted in the steady middle:
from the P-th run to end to the P-th last. Levels go up until one adds less than 10 % over the
best before it, which is the knee.

Per level also, from Redis's own counters over the whole level (idle polling of the workers
included): commands per finished run (`INFO commandstats`) and memory per finished run
(`used_memory`, whose growth is what finished runs leave behind: the run record, outputs,
artifacts and audit log, kept `BATON_QUEUE__RUN_TTL_S`, 7 days by default).
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from bench.docs import Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import bench_settings
from demo import SCENARIO, SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CODE: tuple[str, ...] = ("bench/saturation.py", *STACK, "demo/", "sandbox/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

LEVELS = (1, 2, 3, 4, 6, 8)
"""Worker processes per level, tried in order until the knee."""
MIN_GAIN = 1.10
"""A level that adds less than this factor of runs per minute over the one before ends it."""
RUN_TIMEOUT_S = 300.0


def runs_at(processes: int) -> int:
    return 2 * processes + 5


def redis_counters(client: redis.Redis) -> tuple[int, int]:
    """(commands processed, by every command, so far; bytes used now)."""
    stats = client.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))
    return calls, int(client.info("memory")["used_memory"])


def level(settings: Settings, repo: Path, processes: int, work: Path) -> dict[str, Any]:
    """Keep 2 × `processes` runs in flight until `runs_at(processes)` have been enqueued."""
    total, in_flight = runs_at(processes), 2 * processes
    client = redis.Redis.from_url(settings.require_redis_url())
    queues = [stage.queue for stage in load_pipeline("fixer").stages]
    env = worker_env(settings)
    log = work / f"worker-{processes}.log"
    try:
        with services.worker(env, queues, concurrency=processes, logfile=log):
            commands_before, memory_before = redis_counters(client)
            started = time.monotonic()
            ended = drive(settings, repo, total, in_flight)
            commands_after, memory_after = redis_counters(client)
    finally:
        client.close()
    steady = ended[processes - 1 : total - processes]
    per_min = 60 * (len(steady) - 1) / (steady[-1] - steady[0])
    return {
        "processes": processes,
        "runs": total,
        "in_flight": in_flight,
        "runs_per_minute": round(per_min, 1),
        "wall_s": round(ended[-1] - started, 1),
        "redis_commands_per_run": round((commands_after - commands_before) / total),
        "redis_bytes_per_run": round((memory_after - memory_before) / total),
    }


def drive(settings: Settings, repo: Path, total: int, in_flight: int) -> list[float]:
    """Enqueue runs, `in_flight` at a time; when each ended (monotonic), in order."""
    payload = SENTRY_EVENT.read_bytes()
    pending: set[str] = set()
    ended: list[float] = []
    enqueued = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S * total / in_flight
    while len(ended) < total:
        while enqueued < total and len(pending) < in_flight:
            pending.add(api.enqueue(payload, repo=str(repo), settings=settings, force=True))
            enqueued += 1
        time.sleep(0.1)
        for run_id in sorted(pending):
            run = api.get_run(run_id, settings=settings)
            if run.status.is_terminal:
                if run.status.value != "done":
                    raise RuntimeError(f"saturation run {run_id} ended {run.status}: {run.reason}")
                pending.discard(run_id)
                ended.append(time.monotonic())
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} saturation runs did not end in time")
    return ended


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("saturation", total=len(LEVELS))
    levels: list[dict[str, Any]] = []
    scenario = {**_demo_scenario(), "latency_ms": 0}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(scenario))
        for processes in LEVELS:
            progress.update(task, description=f"saturation: {processes} worker processes")
            with services.redis_server(work / f"redis-{processes}") as url:
                settings = bench_settings(url, fake.url, work)
                repo = make_sample_repo(work / f"shopcart-{processes}.git")
                levels.append(level(settings, repo, processes, work))
            progress.advance(task)
            if knee(levels) is not None:
                break
    progress.update(task, total=len(levels))
    return summarize(levels)


def _demo_scenario() -> dict[str, Any]:
    scenario: dict[str, Any] = json.loads(SCENARIO.read_text())
    return scenario


def knee(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best level before the last, if the last added less than `MIN_GAIN` over it."""
    if len(levels) < 2:
        return None
    best = max(levels[:-1], key=lambda lv: lv["runs_per_minute"])
    return best if levels[-1]["runs_per_minute"] < MIN_GAIN * best["runs_per_minute"] else None


def summarize(levels: list[dict[str, Any]]) -> dict[str, Any]:
    found = knee(levels)
    return {
        "levels": levels,
        "min_gain": MIN_GAIN,
        "knee_processes": found["processes"] if found else None,
        "at_knee": found,
    }


HISTORY = ["runs/min by worker processes", "knee (processes)", "runs/min at the knee",
           "Redis commands per run", "Redis KiB per finished run"]  # fmt: skip
"""The history table's columns after the date and commit (`row`)."""


def _kib(source: Source, level: dict[str, Any]) -> str:
    return f"{source.derive(level['redis_bytes_per_run'] / 1024):.0f}"


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    at = source["at_knee"]
    return [
        " / ".join(f"{lv['processes']}: {lv['runs_per_minute']:.1f}" for lv in source["levels"]),
        str(source["knee_processes"]) if at else "not found",
        f"{at['runs_per_minute']:.1f}" if at else "—",
        f"{at['redis_commands_per_run']:,}" if at else "—",
        _kib(source, at) if at else "—",
    ]


def latest(source: Source) -> str:
    """The latest run: each level's runs per minute and what a run costs Redis."""
    rows = [
        [
            str(lv["processes"]),
            str(lv["in_flight"]),
            str(lv["runs"]),
            f"{lv['runs_per_minute']:.1f}",
            f"{lv['wall_s']:.0f}",
            f"{lv['redis_commands_per_run']:,}",
            _kib(source, lv),
        ]
        for lv in source["levels"]
    ]
    header = ["worker processes", "runs in flight", "runs", "runs/min (steady)", "wall (s)",
              "Redis commands per run", "Redis KiB per finished run"]  # fmt: skip
    knee = source["knee_processes"]
    found = f"the knee is {knee} processes" if knee else "no knee was found"
    return f"{latest_run(source, found)}:\n\n{table(header, rows)}"


SECTIONS = {"latest": latest}

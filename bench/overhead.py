"""Orchestration overhead: the time between one stage ending and the next one starting.

Baton runs five one-call stages against a zero-latency fake model; a stage's hand-off is the
time from its output being recorded to the next stage's task starting (both timestamps are in
the run record). The baseline is a plain Celery chain of five no-op tasks on the same Redis,
with the same worker settings: the time from one task's end to the next one's start.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
from celery import Celery, chain

from bench import record
from bench.stack import bench_settings, empty_repo
from orchestrator import api
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import celery_config
from orchestrator.settings import QueueConfig, Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

PIPELINE = Path(__file__).parent / "pipelines" / "handoff.toml"
RUNS = 30
STAGES = 5
QUEUE = "bench.chain"
"""The baseline chain's queue (`bench.chain_app` serves it)."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def baton_gaps(settings: Settings, repo: Path, i: int) -> list[float]:
    """Run the five-stage pipeline once; the gaps between its stages, in seconds."""
    run_id = api.enqueue(
        f"Overhead run {i}", repo=str(repo), pipeline=str(PIPELINE), settings=settings, force=True
    )
    run = api.get_run(run_id, settings=settings)
    while not run.status.is_terminal:
        time.sleep(0.02)
        run = api.get_run(run_id, settings=settings)
    if run.status.value != "done":
        raise RuntimeError(f"overhead run {run_id} ended {run.status.value}: {run.reason}")
    records = list(run.stages.values())
    return [b.started_at - a.finished_at for a, b in itertools.pairwise(records)]  # type: ignore[operator]


def chain_gaps(app: Celery, client: redis.Redis, i: int) -> list[float]:
    """Run a chain of five no-op tasks once; the gaps between them, in seconds."""
    chain_id = f"c{i}"
    links = [app.signature("bench.noop", args=(None, chain_id, 0), queue=QUEUE)]
    links += [
        app.signature("bench.noop", args=(chain_id, n), queue=QUEUE) for n in range(1, STAGES)
    ]
    chain(*links).apply_async()
    key = f"bench:chain:{chain_id}"
    while not client.hexists(key, f"end:{STAGES - 1}"):
        time.sleep(0.02)
    times = {k: float(v) for k, v in client.hgetall(key).items()}
    return [times[f"start:{n + 1}"] - times[f"end:{n}"] for n in range(STAGES - 1)]


def run(progress: Any) -> dict[str, Any]:
    """Baton runs and plain chains alternate, each on its own idle worker, so that both see the
    same machine at the same time."""
    scenario = {"agents": {"*": [{"json": {"summary": "ok"}}]}, "latency_ms": 0}
    task = progress.add_task("overhead: Baton and a plain chain, alternating", total=RUNS)
    baton: list[float] = []
    plain: list[float] = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(scenario))
        repo = empty_repo(work / "repo")
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        queues = [s.queue for s in load_pipeline(str(PIPELINE)).stages]
        stack.enter_context(
            services.worker(worker_env(settings), queues, logfile=work / "baton.log")
        )
        stack.enter_context(
            services.worker(
                {"BATON_REDIS_URL": redis_url},
                [QUEUE],
                app="bench.chain_app",
                logfile=work / "chain.log",
                name="bench-chain",
            )
        )
        app = Celery("bench-chain-client", set_as_current=False)
        app.conf.update(celery_config(redis_url, QueueConfig()))
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        stack.callback(app.close)
        stack.callback(client.close)
        for i in range(RUNS):
            plain += chain_gaps(app, client, i)
            baton += baton_gaps(settings, repo, i)
            progress.advance(task)
    return summarize(baton, plain)


def summarize(baton: list[float], chain: list[float]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 2),
            "p95_ms": round(1000 * percentile(values, 0.95), 2),
            "n": len(values),
        }

    figures: dict[str, Any] = {"baton": stats(baton), "chain": stats(chain)}
    figures["ratio_p50"] = round(figures["baton"]["p50_ms"] / figures["chain"]["p50_ms"], 2)
    figures["ratio_p95"] = round(figures["baton"]["p95_ms"] / figures["chain"]["p95_ms"], 2)
    return figures


def write(figures: dict[str, Any]) -> None:
    b, c = figures["baton"], figures["chain"]
    detail = record.table(
        ["", "hand-offs", "p50 (ms)", "p95 (ms)"],
        [
            [
                "Baton (record output → next stage starts)",
                str(b["n"]),
                f"{b['p50_ms']:.1f}",
                f"{b['p95_ms']:.1f}",
            ],
            [
                "plain Celery chain of no-op tasks",
                str(c["n"]),
                f"{c['p50_ms']:.1f}",
                f"{c['p95_ms']:.1f}",
            ],
        ],
    )
    row = [
        f"{b['p50_ms']:.1f}",
        f"{b['p95_ms']:.1f}",
        f"{c['p50_ms']:.1f}",
        f"{c['p95_ms']:.1f}",
        f"{figures['ratio_p50']:.2f}×",
        f"{figures['ratio_p95']:.2f}×",
    ]
    record.save("overhead", figures, row, detail)

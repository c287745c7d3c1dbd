"""Orchestration overhead: the time between one stage ending and the next one starting.

Baton runs five one-call stages against a zero-latency fake model; a stage's hand-off is the
time from its output being recorded to the next stage's task starting (both timestamps are in
the run record). The baseline is a plain Celery chain of five no-op tasks on the same Redis,
with the same worker settings: the time from one task's end to the next one's start.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery, chain
from pydantic import SecretStr

from bench import record
from orchestrator import api
from orchestrator.demo import services
from orchestrator.demo.runner import worker_env
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import celery_config
from orchestrator.settings import QueueConfig, Settings
from workers.fake_gemini import FakeGemini

PIPELINE = Path(__file__).parent / "pipelines" / "handoff.toml"
RUNS = 20
STAGES = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def baton_gaps(settings: Settings, repo: Path, progress: Any, task: Any) -> list[float]:
    gaps = []
    for i in range(RUNS):
        run_id = api.enqueue(
            f"Overhead run {i}",
            repo=str(repo),
            pipeline=str(PIPELINE),
            settings=settings,
            force=True,
        )
        run = api.get_run(run_id, settings=settings)
        while not run.status.is_terminal:
            time.sleep(0.02)
            run = api.get_run(run_id, settings=settings)
        if run.status.value != "done":
            raise RuntimeError(f"overhead run {run_id} ended {run.status.value}: {run.reason}")
        records = list(run.stages.values())
        gaps += [b.started_at - a.finished_at for a, b in itertools.pairwise(records)]  # type: ignore[operator]
        progress.advance(task)
    return gaps


def chain_gaps(redis_url: str, work: Path, progress: Any, task: Any) -> list[float]:
    env = {**os.environ, "BATON_REDIS_URL": redis_url}
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.chain_app",
        "worker",
        "-Q",
        "bench.chain",
        "-c",
        "1",
        "-P",
        "prefork",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        "INFO",
    ]
    log = work / "chain-worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=record.ROOT
        )
    app = Celery("bench-chain-client", set_as_current=False)
    app.conf.update(celery_config(redis_url, QueueConfig()))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    gaps: list[float] = []
    try:
        services.wait_for_log(log, "ready.", proc)
        for i in range(RUNS):
            chain_id = f"c{i}"
            links = [app.signature("bench.noop", args=(None, chain_id, 0), queue="bench.chain")]
            links += [
                app.signature("bench.noop", args=(chain_id, n), queue="bench.chain")
                for n in range(1, STAGES)
            ]
            chain(*links).apply_async()
            key = f"bench:chain:{chain_id}"
            while not client.hexists(key, f"end:{STAGES - 1}"):
                time.sleep(0.02)
            times = {k: float(v) for k, v in client.hgetall(key).items()}
            gaps += [times[f"start:{n + 1}"] - times[f"end:{n}"] for n in range(STAGES - 1)]
            progress.advance(task)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        client.close()
        app.close()
    return gaps


def run(progress: Any) -> dict[str, Any]:
    scenario = {"agents": {"*": [{"json": {"summary": "ok"}}]}, "latency_ms": 0}
    task = progress.add_task("overhead", total=2 * RUNS)
    with (
        tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp,
        FakeGemini.start(scenario) as fake,
    ):
        work = Path(tmp)
        repo = work / "repo"
        repo.mkdir()
        for args in (
            ["init", "-q"],
            [
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@b",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "empty",
            ],
        ):
            subprocess.run(["git", "-C", str(repo), *args], check=True)
        with services.redis_server(work / "redis") as redis_url:
            settings = Settings(
                redis_url=redis_url,
                gemini_base_url=fake.url,
                google_api_key=SecretStr("bench-key"),
                repo_cache_dir=work / "cache",
            )
            queues = [s.queue for s in load_pipeline(str(PIPELINE)).stages]
            progress.update(task, description="overhead: plain Celery chain")
            chain = chain_gaps(redis_url, work, progress, task)
            progress.update(task, description="overhead: Baton")
            with services.worker(worker_env(settings), queues, logfile=work / "worker.log"):
                baton = baton_gaps(settings, repo, progress, task)
    return summarize(baton, chain)


def summarize(baton: list[float], chain: list[float]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 2),
            "p95_ms": round(1000 * percentile(values, 0.95), 2),
            "n": len(values),
        }

    figures = {"baton": stats(baton), "chain": stats(chain)}
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

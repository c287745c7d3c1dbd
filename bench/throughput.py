"""Scaling with a slow model: does adding worker processes add runs per minute while the model,
not the machine, is the bottleneck?

40 runs of a five-stage pipeline (one model call per stage, no tools, no sandbox) against a fake
model that answers in 300 ms: the stages mostly wait, so this measures whether more processes
overlap more waiting, not what the machine can do (`bench.saturation` measures that, with real
sandboxed stages and an instant model). Two shapes of fleet:

* **shared**: 1, 2 and 4 worker processes, each serving every stage's queue;
* **split, busy stage scaled**: one process per stage queue, except the busy stage, which gets
  1, 2 and 4 (`docker compose up --scale fix=4`). The busy stage is `h3`, whose model answers
  in 2.4 s, the time of eight 300 ms calls, as a fix stage spends on its tool turns.

Workers are started and idle before the runs are enqueued; the clock runs from the first
enqueue to the last run ending. The target is that 4 processes (of the whole fleet, or of the
busy stage) finish at least 3.2× as many runs per minute as 1.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.docs import Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import bench_settings, empty_repo, together
from orchestrator.control import api
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CODE: tuple[str, ...] = (
    "bench/throughput.py",
    "bench/pipelines/handoff.toml",
    *STACK,
    "sandbox/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PIPELINE = Path(__file__).parent / "pipelines" / "handoff.toml"
RUNS = 40
LATENCY_MS = 300
BUSY_STAGE, BUSY_LATENCY_MS = "h3", 8 * LATENCY_MS
SCALES = (1, 2, 4)
TARGET = 3.2
SHAPES = {
    "shared": "shared: every process serves every queue",
    "busy": f"split: one per queue, {BUSY_STAGE} (busy) scaled",
}


def groups(shape: str, scale: int) -> list[list[str]]:
    """The queues each worker process serves in one configuration."""
    stages = load_pipeline(str(PIPELINE)).stages
    if shape == "shared":
        return [[s.queue for s in stages]] * scale
    return [[s.queue] for s in stages for _ in range(scale if s.name == BUSY_STAGE else 1)]


def scenario(shape: str) -> dict[str, Any]:
    faults = [{"agent": BUSY_STAGE, "latency_ms": BUSY_LATENCY_MS}] if shape == "busy" else []
    return {
        "agents": {"*": [{"json": {"summary": "ok"}}]},
        "latency_ms": LATENCY_MS,
        "faults": faults,
    }


def drain(settings: Settings, repo: Path, label: str) -> float:
    """Enqueue RUNS runs at once; seconds until the last one ends."""
    started = time.monotonic()
    run_ids = [
        api.enqueue(
            f"{label} run {i}",
            repo=str(repo),
            pipeline=str(PIPELINE),
            settings=settings,
            force=True,
        )
        for i in range(RUNS)
    ]
    pending = set(run_ids)
    while pending:
        time.sleep(0.1)
        for run_id in list(pending):
            run = api.get_run(run_id, settings=settings)
            if run.status.is_terminal:
                if run.status.value != "done":
                    raise RuntimeError(
                        f"{label}: run {run_id} ended {run.status.value}: {run.reason}"
                    )
                pending.discard(run_id)
    return time.monotonic() - started


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("throughput", total=len(SHAPES) * len(SCALES))
    results: dict[str, dict[str, float]] = {shape: {} for shape in SHAPES}
    with ExitStack() as outer:
        work = Path(outer.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = outer.enter_context(FakeGemini.start(scenario("shared")))
        repo = empty_repo(work / "repo")
        for shape in SHAPES:
            fake.set_scenario(scenario(shape))
            for scale in SCALES:
                label = f"{shape}-{scale}"
                progress.update(task, description=f"throughput: {SHAPES[shape]}, {scale}")
                with ExitStack() as stack:
                    url = stack.enter_context(services.redis_server(work / f"redis-{label}"))
                    settings = bench_settings(url, fake.url, work)
                    workers = [
                        services.worker(
                            worker_env(settings), served, logfile=work / f"{label}-{n}.log"
                        )
                        for n, served in enumerate(groups(shape, scale))
                    ]
                    stack.enter_context(together(workers))
                    seconds = drain(settings, repo, label)
                results[shape][str(scale)] = round(RUNS / seconds * 60, 1)
                progress.advance(task)
    return summarize(results)


def summarize(results: dict[str, dict[str, float]]) -> dict[str, Any]:
    top, base = str(SCALES[-1]), str(SCALES[0])
    speedup = {shape: round(r[top] / r[base], 2) for shape, r in results.items()}
    return {
        "runs": RUNS,
        "latency_ms": LATENCY_MS,
        "busy_stage": {"name": BUSY_STAGE, "latency_ms": BUSY_LATENCY_MS},
        "runs_per_minute": results,
        "speedup": speedup,
        "target": TARGET,
        "met": all(speedup[shape] >= TARGET for shape in SHAPES),
    }


HISTORY = [
    *(f"shared {n}" + (" (runs/min)" if n == SCALES[0] else "") for n in SCALES),
    f"shared {SCALES[-1]} vs {SCALES[0]}",
    *(f"busy {n}" for n in SCALES),
    f"busy {SCALES[-1]} vs {SCALES[0]}",
]
"""The history table's columns after the date and commit (`row`)."""


def _cells(source: Source, shape: str) -> list[str]:
    rpm = source["runs_per_minute"][shape]
    return [*(f"{rpm[str(s)]:.1f}" for s in SCALES), f"{source['speedup'][shape]:.2f}×"]


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    return [cell for shape in SHAPES for cell in _cells(source, shape)]


def latest(source: Source) -> str:
    """The latest run: runs per minute by fleet shape and size, against the target."""
    top, base = SCALES[-1], SCALES[0]
    header = ["fleet", *(f"{s}: runs/min" for s in SCALES), f"{top} vs {base}", "target"]
    rows = [[SHAPES[shape], *_cells(source, shape), f"≥ {source['target']}×"] for shape in SHAPES]
    busy = source["busy_stage"]
    setup = (
        f"{source['runs']} runs, the model answering in {source['latency_ms']} ms, the busy "
        f"stage {busy['name']} in {busy['latency_ms']} ms"
    )
    return f"{latest_run(source, setup)}:\n\n{table(header, rows)}"


SECTIONS = {"latest": latest}

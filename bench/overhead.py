"""Orchestration overhead: what Baton costs per stage, against the strongest plain chain.

Both run five stages with one model call each against an instant fake model, 30 times,
alternating run by run, each on its own idle worker (one prefork process, the same Celery
settings: acks late, prefetch 1):

* **Baton**: the five-stage pipeline `bench/pipelines/handoff.toml`;
* **plain chain**: a Celery `chain` of five tasks on the same Redis, each making one
  google-genai call to the same fake server with one client per process (`bench.chain_app`).

Measured per stage, from the task's start (Celery's `task_prerun`, traced the same way in both
workers, `bench.trace`) and the fake server's record of when each request arrived and when its
reply was ready:

1. **start → first request**: from the task's start to its model request reaching the server;
2. **reply → next request**: from a stage's last model reply to the next stage's first model
   request: the whole hand-off, recording and enqueueing included;
3. **CPU per stage**: the worker's CPU time (/proc: user + system, its subprocesses included)
   over the measured runs, divided by the stages run; the pool process (where stages run) and
   the main process (which receives the messages) apart.

Targets: (2) at most 3× the chain's at p50; Baton's pool CPU at most 15 ms per stage.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from celery import Celery, chain

from bench import cpu, record, trace
from bench.stack import bench_settings, empty_repo
from orchestrator import api
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import celery_config
from orchestrator.settings import QueueConfig, Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

PIPELINE = Path(__file__).parent / "pipelines" / "handoff.toml"
BATON_STAGES = ["h1", "h2", "h3", "h4", "h5"]
CHAIN_STAGES = ["p1", "p2", "p3", "p4", "p5"]
RUNS = 30
WARMUP = 2
"""Runs of each before measuring: the first stages of a fresh worker import and connect."""
QUEUE = "bench.chain"
"""The baseline chain's queue (`bench.chain_app` serves it)."""
MAX_HANDOFF_RATIO = 3.0
MAX_CPU_MS = 15.0
RUN_TIMEOUT_S = 60.0
POLL_S = 0.02
"""How often the driver looks whether a run has ended (the runs' own timings do not depend on
it: they come from the workers' traces and the fake server's record)."""

MEASURES = {
    "start_to_first_request": "(1) task start → its first model request (ms)",
    "reply_to_next_request": "(2) last model reply → next stage's first request (ms)",
    "reply_to_task_end": "… of (2): last model reply → its task's end",
    "task_end_to_next_start": "… of (2): task end → the next task's start",
}
"""What is measured per stage (the rest of (2) is (1) of the next stage)."""

Run = tuple[dict[str, str], list[dict[str, Any]]]
"""One run: stage → its task id, and the fake server's record of the run's requests."""


def baton_run(settings: Settings, repo: Path, i: int) -> dict[str, str]:
    run_id = api.enqueue(
        f"Overhead run {i}", repo=str(repo), pipeline=str(PIPELINE), settings=settings, force=True
    )
    _wait(lambda: api.get_run(run_id, settings=settings).status.is_terminal, f"run {run_id}")
    run = api.get_run(run_id, settings=settings)
    if run.status.value != "done":
        raise RuntimeError(f"overhead run {run_id} ended {run.status.value}: {run.reason}")
    return {stage: f"{run_id}.{stage}" for stage in BATON_STAGES}


def chain_run(app: Celery, trace_file: Path, i: int) -> dict[str, str]:
    ids = {stage: f"chain{i}.{stage}" for stage in CHAIN_STAGES}
    links = [
        app.signature(
            "bench.stage",
            args=(None, stage) if n == 0 else (stage,),
            queue=QUEUE,
            task_id=ids[stage],
        )
        for n, stage in enumerate(CHAIN_STAGES)
    ]
    chain(*links).apply_async()
    _wait(lambda: trace.seen(trace_file, ids[CHAIN_STAGES[-1]]), f"chain {i}")
    return ids


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not finish within {RUN_TIMEOUT_S:.0f}s")
        time.sleep(POLL_S)


def measured(fake: FakeGemini, stages: list[str], go: Callable[[], dict[str, str]]) -> Run:
    """Run once on a freshly reset fake server; the task ids and the server's record."""
    fake.reset()
    ids = go()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    entries = fake.requests()
    while {e["agent"] for e in entries} < set(stages):  # the last call may still be recording
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fake server never saw all of {stages}")
        time.sleep(POLL_S)
        entries = fake.requests()
    return ids, entries


Traces = tuple[dict[str, float], dict[str, float]]
"""Task id → start, and task id → end."""


def intervals(runs: list[Run], traced: Traces, stages: list[str]) -> dict[str, list[float]]:
    """The measured intervals, in seconds; (2) also in its parts: the last reply → its task's
    end, the task's end → the next task's start (the next task's start → its first request is
    (1))."""
    starts, ends = traced
    found: dict[str, list[float]] = {name: [] for name in MEASURES}
    for ids, entries in runs:
        first = {s: min(e["ts"] for e in entries if e["agent"] == s) for s in stages}
        last = {s: max(e["replied"] for e in entries if e["agent"] == s) for s in stages}
        found["start_to_first_request"] += [first[s] - starts[ids[s]] for s in stages]
        for a, b in itertools.pairwise(stages):
            found["reply_to_next_request"].append(first[b] - last[a])
            found["reply_to_task_end"].append(ends[ids[a]] - last[a])
            found["task_end_to_next_start"].append(starts[ids[b]] - ends[ids[a]])
    return found


def run(progress: Any) -> dict[str, Any]:
    scenario = {"agents": {"*": [{"json": {"summary": "ok"}}]}, "latency_ms": 0}
    task = progress.add_task("overhead: Baton and a plain chain, alternating", total=RUNS)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        # In a process of its own: in this one, the waiting below would delay its replies.
        (work / "scenario.json").write_text(json.dumps(scenario))
        fake = FakeGemini(stack.enter_context(services.fake_gemini(work / "scenario.json")))
        repo = empty_repo(work / "repo")
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        traces = {"baton": work / "baton.trace", "chain": work / "chain.trace"}
        queues = [s.queue for s in load_pipeline(str(PIPELINE)).stages]
        baton_env = {**worker_env(settings), trace.TRACE_FILE_ENV: str(traces["baton"])}
        chain_env = {"BATON_REDIS_URL": redis_url, "BENCH_GEMINI_URL": fake.url,
                     trace.TRACE_FILE_ENV: str(traces["chain"])}  # fmt: skip
        workers = {
            "baton": stack.enter_context(services.worker(
                baton_env, queues, app="bench.baton_app", logfile=work / "baton.log"
            )),
            "chain": stack.enter_context(services.worker(
                chain_env, [QUEUE], app="bench.chain_app", logfile=work / "chain.log",
                name="bench-chain",
            )),
        }  # fmt: skip
        app = Celery("bench-chain-client", set_as_current=False)
        app.conf.update(celery_config(redis_url, QueueConfig()))
        stack.callback(app.close)
        go = {
            "baton": lambda i: measured(fake, BATON_STAGES, lambda: baton_run(settings, repo, i)),
            "chain": lambda i: measured(
                fake, CHAIN_STAGES, lambda: chain_run(app, traces["chain"], i)
            ),
        }
        runs: dict[str, list[Run]] = {"baton": [], "chain": []}
        before: dict[str, cpu.WorkerCpu] = {}
        for i in range(WARMUP + RUNS):
            if i == WARMUP:
                before = {name: cpu.worker_cpu(w.pid) for name, w in workers.items()}
            for name in ("baton", "chain") if i % 2 else ("chain", "baton"):
                done = go[name](i)
                if i >= WARMUP:
                    runs[name].append(done)
            if i >= WARMUP:
                progress.advance(task)
        spent = {
            name: cpu.spent(before[name], cpu.worker_cpu(w.pid)) for name, w in workers.items()
        }
        traced = {name: (trace.read(p), trace.read(p, "end")) for name, p in traces.items()}
    return summarize(
        {
            "baton": intervals(runs["baton"], traced["baton"], BATON_STAGES),
            "chain": intervals(runs["chain"], traced["chain"], CHAIN_STAGES),
        },
        {name: (main, pool) for name, (main, pool) in spent.items()},
    )


def summarize(
    timings: dict[str, dict[str, list[float]]], spent: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 2),
            "p95_ms": round(1000 * record.percentile(values, 0.95), 2),
            "n": len(values),
        }

    stages = RUNS * len(BATON_STAGES)
    figures: dict[str, Any] = {"runs": RUNS, "stages_per_run": len(BATON_STAGES)}
    for measure in MEASURES:
        baton, plain = stats(timings["baton"][measure]), stats(timings["chain"][measure])
        figures[measure] = {
            "baton": baton,
            "chain": plain,
            "ratio_p50": round(baton["p50_ms"] / max(plain["p50_ms"], 0.01), 2),
            "ratio_p95": round(baton["p95_ms"] / max(plain["p95_ms"], 0.01), 2),
        }
    figures["cpu_ms_per_stage"] = {
        name: {"pool": round(1000 * pool / stages, 2), "main": round(1000 * main / stages, 2)}
        for name, (main, pool) in spent.items()
    }
    handoff = figures["reply_to_next_request"]["ratio_p50"]
    cpu_ms = figures["cpu_ms_per_stage"]["baton"]["pool"]
    figures["targets"] = {
        "handoff_ratio_p50": {"target": f"<= {MAX_HANDOFF_RATIO}", "value": handoff,
                              "met": handoff <= MAX_HANDOFF_RATIO},
        "baton_pool_cpu_ms_per_stage": {"target": f"<= {MAX_CPU_MS}", "value": cpu_ms,
                                        "met": cpu_ms <= MAX_CPU_MS},
    }  # fmt: skip
    return figures


def write(figures: dict[str, Any]) -> None:
    start, handoff = figures["start_to_first_request"], figures["reply_to_next_request"]
    cpu_ms = figures["cpu_ms_per_stage"]

    def timing_row(label: str, m: dict[str, Any]) -> list[str]:
        b, c = m["baton"], m["chain"]
        cells = [b["p50_ms"], b["p95_ms"], c["p50_ms"], c["p95_ms"]]
        return [label, *(f"{v:.1f}" for v in cells), f"{m['ratio_p50']:.2f}×",
                f"{m['ratio_p95']:.2f}×"]  # fmt: skip

    rows = [
        *(timing_row(label, figures[measure]) for measure, label in MEASURES.items()),
        ["(3) CPU per stage, pool process (ms)", f"{cpu_ms['baton']['pool']:.1f}", "",
         f"{cpu_ms['chain']['pool']:.1f}", "",
         f"{cpu_ms['baton']['pool'] / cpu_ms['chain']['pool']:.2f}×", ""],
        ["(3) CPU per stage, main process (ms)", f"{cpu_ms['baton']['main']:.1f}", "",
         f"{cpu_ms['chain']['main']:.1f}", "",
         f"{cpu_ms['baton']['main'] / cpu_ms['chain']['main']:.2f}×", ""],
    ]  # fmt: skip
    header = ["per stage", "Baton p50", "Baton p95", "chain p50", "chain p95", "ratio p50",
              "ratio p95"]  # fmt: skip
    detail = record.table(header, rows)
    detail += "\n\n" + record.targets_table(figures["targets"])
    row = [
        f"{start['baton']['p50_ms']:.1f} / {start['chain']['p50_ms']:.1f}",
        f"{handoff['baton']['p50_ms']:.1f} / {handoff['chain']['p50_ms']:.1f}",
        f"{handoff['ratio_p50']:.2f}×",
        f"{cpu_ms['baton']['pool']:.1f} / {cpu_ms['chain']['pool']:.1f}",
        "yes" if all(t["met"] for t in figures["targets"].values()) else "**no**",
    ]
    record.save("overhead", figures, row, detail)

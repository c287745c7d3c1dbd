"""Orchestration overhead: what Baton costs per stage, against the strongest plain chains.

Each runs five stages with one model call each against an instant fake model, 30 times,
rotating run by run, each on its own idle worker (one prefork process, the same Celery
settings: acks late, prefetch 1):

* **Baton**: the five-stage pipeline `bench/pipelines/handoff.toml`;
* **ADK chain**: a Celery `chain` of five tasks on the same Redis, each running its model call
  in a fresh Google ADK session, as a Baton stage does, with nothing else of Baton
  (`bench.adk_chain_app`): what Baton's stages cannot cost less than while each is a fresh
  ADK session;
* **plain chain**: the same chain with one google-genai call per task instead, one client per
  process (`bench.chain_app`).

Measured per stage, from the task's start (Celery's `task_prerun`, traced the same way in all
the workers, `bench.trace`) and the fake server's record of when each request arrived and when
its reply was ready:

1. **start → first request**: from the task's start to its model request reaching the server;
2. **reply → next request**: from a stage's last model reply to the next stage's first model
   request: the whole hand-off, recording and enqueueing included;
3. **CPU per stage**: the worker's CPU time (/proc: user + system, its subprocesses included)
   over the measured runs, divided by the stages run; the pool process (where stages run) and
   the main process (which receives the messages) apart.

Targets: (2) at most 3× the plain chain's at p50; Baton's pool CPU at most 15 ms per stage.
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
from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED, STACK
from bench.stack import bench_settings, empty_repo
from orchestrator.control import api
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import celery_config
from orchestrator.core.settings import QueueConfig, Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CODE: tuple[str, ...] = (
    "bench/overhead.py",
    "bench/pipelines/handoff.toml",
    "bench/cpu.py",
    "bench/trace.py",
    "bench/baton_app.py",
    "bench/chain_app.py",
    "bench/adk_chain_app.py",
    "bench/baseline.py",
    *STACK,
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PIPELINE = Path(__file__).parent / "pipelines" / "handoff.toml"
BATON_STAGES = ["h1", "h2", "h3", "h4", "h5"]
CHAIN_STAGES = ["p1", "p2", "p3", "p4", "p5"]
ADK_STAGES = ["a1", "a2", "a3", "a4", "a5"]
RUNS = 30
WARMUP = 2
"""Runs of each before measuring: the first stages of a fresh worker import and connect."""
QUEUE = "bench.chain"
"""The plain chain's queue (`bench.chain_app` serves it)."""
ADK_QUEUE = "bench.adk_chain"
"""The ADK chain's queue (`bench.adk_chain_app` serves it)."""
CONTENDERS = {"baton": "Baton", "adk": "ADK chain", "chain": "plain chain"}
"""Who is measured, in the order of the tables' columns."""
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


def chain_run(
    app: Celery, trace_file: Path, i: int, *, task: str, queue: str, stages: list[str]
) -> dict[str, str]:
    """One chain of `task`s, one per stage, each given the previous one's reply."""
    ids = {stage: f"{queue}.{i}.{stage}" for stage in stages}
    links = [
        app.signature(task, args=(None, stage) if n == 0 else (stage,), queue=queue,
                      task_id=ids[stage])
        for n, stage in enumerate(stages)
    ]  # fmt: skip
    chain(*links).apply_async()
    _wait(lambda: trace.seen(trace_file, ids[stages[-1]]), f"{queue} run {i}")
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
    task = progress.add_task("overhead: Baton, an ADK chain and a plain chain, in turn", total=RUNS)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        # In a process of its own: in this one, the waiting below would delay its replies.
        (work / "scenario.json").write_text(json.dumps(scenario))
        fake = FakeGemini(stack.enter_context(services.fake_gemini(work / "scenario.json")))
        repo = empty_repo(work / "repo")
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        traces = {name: work / f"{name}.trace" for name in CONTENDERS}
        queues = [s.queue for s in load_pipeline(str(PIPELINE)).stages]
        baton_env = {**worker_env(settings), trace.TRACE_FILE_ENV: str(traces["baton"])}

        def chain_env(name: str) -> dict[str, str]:
            return {"BATON_REDIS_URL": redis_url, "BENCH_GEMINI_URL": fake.url,
                    trace.TRACE_FILE_ENV: str(traces[name])}  # fmt: skip

        workers = {
            "baton": stack.enter_context(services.worker(
                baton_env, queues, app="bench.baton_app", logfile=work / "baton.log"
            )),
            "adk": stack.enter_context(services.worker(
                chain_env("adk"), [ADK_QUEUE], app="bench.adk_chain_app",
                logfile=work / "adk.log", name="bench-adk-chain",
            )),
            "chain": stack.enter_context(services.worker(
                chain_env("chain"), [QUEUE], app="bench.chain_app", logfile=work / "chain.log",
                name="bench-chain",
            )),
        }  # fmt: skip
        app = Celery("bench-chain-client", set_as_current=False)
        app.conf.update(celery_config(redis_url, QueueConfig()))
        stack.callback(app.close)
        stages = {"baton": BATON_STAGES, "adk": ADK_STAGES, "chain": CHAIN_STAGES}
        go: dict[str, Callable[[int], dict[str, str]]] = {
            "baton": lambda i: baton_run(settings, repo, i),
            "adk": lambda i: chain_run(app, traces["adk"], i, task="bench.adk_stage",
                                       queue=ADK_QUEUE, stages=ADK_STAGES),
            "chain": lambda i: chain_run(app, traces["chain"], i, task="bench.stage",
                                         queue=QUEUE, stages=CHAIN_STAGES),
        }  # fmt: skip
        runs: dict[str, list[Run]] = {name: [] for name in CONTENDERS}
        before: dict[str, cpu.WorkerCpu] = {}
        order = list(CONTENDERS)
        for i in range(WARMUP + RUNS):
            if i == WARMUP:
                before = {name: cpu.worker_cpu(w.pid) for name, w in workers.items()}
            turn = i % len(order)
            for name in order[turn:] + order[:turn]:  # each goes first in turn
                done = measured(fake, stages[name], lambda: go[name](i))  # noqa: B023
                if i >= WARMUP:
                    runs[name].append(done)
            if i >= WARMUP:
                progress.advance(task)
        spent = {
            name: cpu.spent(before[name], cpu.worker_cpu(w.pid)) for name, w in workers.items()
        }
        traced = {name: (trace.read(p), trace.read(p, "end")) for name, p in traces.items()}
    return summarize(
        {name: intervals(runs[name], traced[name], stages[name]) for name in CONTENDERS},
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
        found = {name: stats(timings[name][measure]) for name in CONTENDERS}
        baton, plain = found["baton"], found["chain"]
        figures[measure] = {
            **found,
            "ratio_p50": round(baton["p50_ms"] / max(plain["p50_ms"], 0.01), 2),
            "ratio_p95": round(baton["p95_ms"] / max(plain["p95_ms"], 0.01), 2),
        }
    cpu_ms = {
        name: {"pool": round(1000 * pool / stages, 2), "main": round(1000 * main / stages, 2)}
        for name, (main, pool) in spent.items()
    }
    figures["cpu_ms_per_stage"] = cpu_ms
    figures["baton_beyond_adk_cpu_ms_per_stage"] = round(
        cpu_ms["baton"]["pool"] - cpu_ms["adk"]["pool"], 2
    )
    handoff = figures["reply_to_next_request"]["ratio_p50"]
    baton_cpu = cpu_ms["baton"]["pool"]
    figures["targets"] = {
        "handoff_ratio_p50": {"target": f"<= {MAX_HANDOFF_RATIO}", "value": handoff,
                              "met": handoff <= MAX_HANDOFF_RATIO},
        "baton_pool_cpu_ms_per_stage": {"target": f"<= {MAX_CPU_MS}", "value": baton_cpu,
                                        "met": baton_cpu <= MAX_CPU_MS},
    }  # fmt: skip
    return figures


HISTORY = ["(1) p50 Baton / chain (ms)", "(2) p50 Baton / chain (ms)", "(2) ratio p50",
           "(3) pool CPU Baton / ADK chain / plain chain (ms)", "targets met"]  # fmt: skip
"""The history table's columns after the date and commit (`row`); a run from before the ADK
chain was measured shows `–` for it."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    start, handoff = source["start_to_first_request"], source["reply_to_next_request"]
    cpu_ms = source["cpu_ms_per_stage"]
    return [
        f"{start['baton']['p50_ms']:.1f} / {start['chain']['p50_ms']:.1f}",
        f"{handoff['baton']['p50_ms']:.1f} / {handoff['chain']['p50_ms']:.1f}",
        f"{handoff['ratio_p50']:.2f}×",
        " / ".join(f"{cpu_ms[name]['pool']:.1f}" if name in cpu_ms else "–" for name in CONTENDERS),
        "yes" if all(t["met"] for t in source["targets"].values()) else "**no**",
    ]


def latest(source: Source) -> str:
    """The latest run: every measure per contender, the CPU, the targets."""
    cpu_ms = source["cpu_ms_per_stage"]

    def timing_row(label: str, m: dict[str, Any]) -> list[str]:
        cells = [m[name][p] for name in CONTENDERS for p in ("p50_ms", "p95_ms")]
        return [label, *(f"{v:.1f}" for v in cells), f"{m['ratio_p50']:.2f}×",
                f"{m['ratio_p95']:.2f}×"]  # fmt: skip

    def cpu_row(label: str, process: str) -> list[str]:
        ratio = source.derive(cpu_ms["baton"][process] / cpu_ms["chain"][process])
        cells = [f"{cpu_ms[name][process]:.1f}" for name in CONTENDERS]
        return [label, *(cell for c in cells for cell in (c, "")), f"{ratio:.2f}×", ""]

    rows = [
        *(timing_row(label, source[measure]) for measure, label in MEASURES.items()),
        cpu_row("(3) CPU per stage, pool process (ms)", "pool"),
        cpu_row("(3) CPU per stage, main process (ms)", "main"),
    ]
    runs = f"{source['runs']} runs of {source['stages_per_run']} stages each"
    header = ["per stage", *(f"{title} {p}" for title in CONTENDERS.values()
                             for p in ("p50", "p95")),
              "ratio p50 (Baton / plain chain)", "ratio p95"]  # fmt: skip
    return (
        f"{latest_run(source, runs)}:"
        f"\n\n{table(header, rows)}\n\n"
        f"Baton's pool CPU beyond the ADK chain's: "
        f"{source['baton_beyond_adk_cpu_ms_per_stage']:.1f} ms per stage.\n\n"
        + targets_table(source["targets"])
    )


SECTIONS = {"latest": latest}

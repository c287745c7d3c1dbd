"""Fan-out overhead: from a stage's end to all of its N branches started, against Celery's own
fan-out (`python -m bench fanout`).

Each run is two stages with one model call each against an instant fake model: the first lists N
items, the second fans out over them, one branch per item (`map`). Measured, for N = 3 and 10,
`RUNS` runs each, rotating with the baseline run by run, each on its own idle worker of N
prefork processes (the same Celery settings: acks late, prefetch 1):

* **Baton**: `<run>.fan.b1` … `bN`, queued and sent by the transaction that records the first
  stage (`orchestrator.core.fanout`), each a stage task that claims its branch in the run's
  transaction when it starts;
* **Celery group**: a task that makes the same one model call and then sends a Celery `group` of
  N tasks (`bench.chain_app`): the fan-out with no record of it at all, what Baton's cannot cost
  less than.

From the first stage's model reply (the fake server's record of when it was ready) to the start of
each branch's task (Celery's `task_prerun`, traced alike in both workers, `bench.trace`): the
**first** branch started and **all** started. What lies between is the same work in both but for
Baton's: recording the stage's output and the branches in one transaction, and sending the tasks.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from celery import Celery
from pydantic import BaseModel, ConfigDict

from bench import record, trace
from bench.docs import Source, latest_run, table
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
    "bench/fanout.py",
    "bench/trace.py",
    "bench/baton_app.py",
    "bench/chain_app.py",
    "bench/baseline.py",
    *STACK,
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

FAN_SIZES = (3, 10)
RUNS = 15
WARMUP = 2
"""Runs of each before measuring: the first tasks of a fresh worker import and connect."""
QUEUE = "bench.chain"
"""The baseline's queue (`bench.chain_app` serves it)."""
CONTENDERS = {"baton": "Baton", "group": "Celery group"}
RUN_TIMEOUT_S = 60.0
POLL_S = 0.02
PIPELINE = """
name = "bench-fanout"

[[stages]]
name = "list"
output_schema = "bench.fanout:Items"
instruction = "List the items.\\n{{issue}}"

[[stages]]
name = "fan"
output_schema = "orchestrator.pipelines.schemas:Summary"
map = "list.items"
instruction = "Look at {{item}}."
"""


class Items(BaseModel):
    """The first stage's output: what the second fans out over."""

    model_config = ConfigDict(extra="forbid")

    items: list[str]


def baton_run(settings: Settings, pipeline: Path, repo: Path, i: int, n: int) -> dict[str, Any]:
    """One run of the two-stage pipeline; the branch task ids."""
    run_id = api.enqueue(
        f"Fan-out run {n}.{i}", repo=str(repo), pipeline=str(pipeline), settings=settings,
        force=True,
    )  # fmt: skip
    _wait(lambda: api.get_run(run_id, settings=settings).status.is_terminal, f"run {run_id}")
    run = api.get_run(run_id, settings=settings)
    if run.status.value != "done":
        raise RuntimeError(f"fan-out run {run_id} ended {run.status.value}: {run.reason}")
    return {"first": "list", "branches": [f"{run_id}.fan.b{k}" for k in range(1, n + 1)]}


def group_run(app: Celery, trace_file: Path, i: int, n: int) -> dict[str, Any]:
    """One model call, then a Celery group of `n` tasks (`bench.fan_out`)."""
    prefix = f"{QUEUE}.{n}.{i}"
    app.send_task("bench.fan_out", args=(prefix, n), queue=QUEUE, task_id=f"{prefix}.p0")
    branches = [f"{prefix}.b{k}" for k in range(1, n + 1)]
    _wait(lambda: all(trace.seen(trace_file, task) for task in branches), f"group {prefix}")
    return {"first": "p0", "branches": branches}


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not finish within {RUN_TIMEOUT_S:.0f}s")
        time.sleep(POLL_S)


def replied(fake: FakeGemini, agent: str) -> float:
    """When the fake server's reply to `agent`'s (one) request was ready."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (ends := [e["replied"] for e in fake.requests() if e["agent"] == agent]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fake server never answered {agent}")
        time.sleep(POLL_S)
    return max(ends)


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task(
        "fanout: Baton and a Celery group, in turn", total=len(FAN_SIZES) * RUNS
    )
    figures: dict[str, Any] = {"runs": RUNS, "fan_sizes": list(FAN_SIZES)}
    for n in FAN_SIZES:
        figures[f"n{n}"] = _measure(n, progress, task)
    return figures


def _measure(n: int, progress: Any, task: Any) -> dict[str, Any]:
    items = {"items": [f"item {k}" for k in range(1, n + 1)]}
    scenario = {
        "agents": {"list": [{"json": items}], "*": [{"json": {"summary": "ok"}}]},
        "latency_ms": 0,
    }
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        (work / "scenario.json").write_text(json.dumps(scenario))
        fake = FakeGemini(stack.enter_context(services.fake_gemini(work / "scenario.json")))
        repo = empty_repo(work / "repo")
        pipeline = work / "fanout.toml"
        pipeline.write_text(PIPELINE.replace("{{", "{").replace("}}", "}"))
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        traces = {name: work / f"{name}.trace" for name in CONTENDERS}
        queues = [stage.queue for stage in load_pipeline(str(pipeline)).stages]
        baton_env = {**worker_env(settings), trace.TRACE_FILE_ENV: str(traces["baton"])}
        group_env = {"BATON_REDIS_URL": redis_url, "BENCH_GEMINI_URL": fake.url,
                     trace.TRACE_FILE_ENV: str(traces["group"])}  # fmt: skip
        stack.enter_context(services.worker(
            baton_env, queues, concurrency=n, app="bench.baton_app", logfile=work / "baton.log"
        ))  # fmt: skip
        stack.enter_context(services.worker(
            group_env, [QUEUE], concurrency=n, app="bench.chain_app", logfile=work / "group.log",
            name="bench-group",
        ))  # fmt: skip
        app = Celery("bench-fanout-client", set_as_current=False)
        app.conf.update(celery_config(redis_url, QueueConfig()))
        stack.callback(app.close)
        go: dict[str, Callable[[int], dict[str, Any]]] = {
            "baton": lambda i: baton_run(settings, pipeline, repo, i, n),
            "group": lambda i: group_run(app, traces["group"], i, n),
        }
        found: dict[str, dict[str, list[float]]] = {
            name: {"first_started": [], "all_started": []} for name in CONTENDERS
        }
        order = list(CONTENDERS)
        for i in range(WARMUP + RUNS):
            for name in order[i % 2 :] + order[: i % 2]:  # each goes first in turn
                fake.reset()
                ids = go[name](i)
                reply = replied(fake, ids["first"])
                _wait(lambda: all(trace.seen(traces[name], t) for t in ids["branches"]),  # noqa: B023
                      f"{name} branches")  # fmt: skip
                starts = trace.read(traces[name])
                begun = [starts[branch] - reply for branch in ids["branches"]]
                if i >= WARMUP:
                    found[name]["first_started"].append(min(begun))
                    found[name]["all_started"].append(max(begun))
            if i >= WARMUP:
                progress.advance(task)
    return summarize(found)


def summarize(found: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """p50 and p95 of each measure per contender (ms), and Baton's over the group's."""

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 2),
            "p95_ms": round(1000 * record.percentile(values, 0.95), 2),
            "n": len(values),
        }

    figures: dict[str, Any] = {}
    for measure in ("first_started", "all_started"):
        each = {name: stats(found[name][measure]) for name in CONTENDERS}
        figures[measure] = {
            **each,
            "ratio_p50": round(each["baton"]["p50_ms"] / max(each["group"]["p50_ms"], 0.01), 2),
        }
    return figures


def latest(source: Source) -> str:
    """The latest run: per fan size, first and all branches started, Baton and the group."""
    rows = []
    for n in source["fan_sizes"]:
        for measure, label in (("first_started", "first"), ("all_started", "all")):
            m = source[f"n{n}"][measure]
            rows.append([
                f"N = {n}: {label} branch{'es' if label == 'all' else ''} started",
                *(f"{m[name][p]:.1f}" for name in CONTENDERS for p in ("p50_ms", "p95_ms")),
                f"{m['ratio_p50']:.2f}×",
            ])  # fmt: skip
    header = ["from the first stage's model reply (ms)",
              *(f"{title} {p}" for title in CONTENDERS.values() for p in ("p50", "p95")),
              "ratio p50 (Baton / group)"]  # fmt: skip
    runs = f"{source['runs']} runs of each size"
    return f"{latest_run(source, runs)}:\n\n{table(header, rows)}"


SECTIONS = {"latest": latest}

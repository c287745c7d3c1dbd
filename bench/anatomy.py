"""Run anatomy: where a fixer run's wall time goes, stage by stage (`python -m bench anatomy`).

The fixer pipeline with its real Docker sandboxes, a fresh redis-server and one worker of one
process serving every stage (as `baton demo` starts it), against the fake Gemini server
answering at once (`latency_ms` 0): what is left is Baton's, Docker's and the tests' time.
Cases, one run at a time:

- the demo (`make demo`'s sample repository and Sentry event, the demo's scenario): its first run
  on the fresh worker, which is what `make demo` measures (the worker process's first imports
  and connections fall in it), then `WARM_RUNS` more on the same worker, of which the one of
  median wall time is shown;
- `CORPUS` instances of the evaluation corpus (eval/corpus, `baton eval`'s oracle policy), each
  run twice on the same worker: the second is shown (the first may build the environment image).

Per stage, from what Baton records: the queue wait (the stage record's `queued_at` to
`started_at`: from its task's enqueue until a worker claimed it), and, of the stage's own time
(`started_at` to `finished_at`, every iteration of a looped stage), the phases its executions
timed (`workers.timings`, the `timings` audit entries): environment, sandbox start, copy-in,
build, test runs, model calls, sandbox removal. The rest of the stage's time is Baton's own:
claiming, resolving inputs, ADK's agent and session, tools that read files in the sandbox,
recording. `between stages` is what no stage record covers (the run's creation to its first
stage's enqueue, and the time between a looped stage's iterations). The run's wall time is its
record's `created_at` to its last stage's end, the sum of all of these.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.docs import ROOT, Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import bench_settings
from demo import SCENARIO, SENTRY_EVENT
from demo.runner import make_sample_repo
from evaluation.cli import DOWNLOADS
from evaluation.corpus import load_corpus, materialize
from evaluation.policies import scenario
from orchestrator.control import api
from orchestrator.core.models import RunRecord, RunStatus, StageRecord
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env
from workers import timings

CODE: tuple[str, ...] = (
    "bench/anatomy.py",
    *STACK,
    "demo/",
    "sandbox/",
    "images/",
    "evaluation/",
    "eval/corpus/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PIPELINE = "fixer"
WARM_RUNS = 3
CORPUS = ("toolz-1.2.0-interpose-empty", "markdown-3.11.3-autolink-schemes")
"""A small suite and a larger one."""
CORPUS_ROOT = ROOT / "eval" / "corpus"
RUN_TIMEOUT_S = 600.0
POLL_S = 0.05
QUEUE_WAIT = "queue_wait_s"
REST = "rest_s"
COLUMNS = (QUEUE_WAIT, *timings.PHASES, REST)
"""A stage's time, in the order of the tables: every column sums to the stage's part of the
run's wall time."""
LABELS = {
    QUEUE_WAIT: "queue wait",
    timings.ENVIRONMENT: "environment",
    timings.SANDBOX_START: "sandbox start",
    timings.COPY_IN: "copy-in",
    timings.BUILD: "build",
    timings.COMMANDS: "test runs",
    timings.CHANGES: "patches and diffs",
    timings.TOOLS: "code tools",
    timings.MODEL: "model calls",
    timings.SANDBOX_STOP: "sandbox removal",
    REST: "Baton's own",
}


@dataclass(frozen=True)
class Case:
    """What one run is enqueued with."""

    name: str
    repo: str
    payload: bytes | str | Mapping[str, Any]
    ref: str | None = None
    environment: Mapping[str, Any] | None = None


def anatomy(run: RunRecord, audit: list[dict[str, str]], order: list[str]) -> dict[str, Any]:
    """Where `run`'s wall time went, per stage of `order` (those that ran), from its record and
    its audit log's `timings` entries; seconds, and each column's share of the run."""
    spent: dict[str, dict[str, float]] = {}
    for entry in audit:
        if entry.get("kind") == timings.AUDIT_KIND:
            phases = spent.setdefault(entry["stage"], dict.fromkeys(timings.PHASES, 0.0))
            data = json.loads(entry["data"])
            for phase in timings.PHASES:
                phases[phase] += float(data.get(phase, 0.0))
    rows: dict[str, dict[str, float]] = {}
    for name in order:
        record = run.stages.get(name)
        if record is None or record.started_at is None or record.finished_at is None:
            continue
        own_s = _own_s(record)
        phases = spent.get(name, dict.fromkeys(timings.PHASES, 0.0))
        waited_s = record.started_at - (record.queued_at or run.created_at)
        rows[name] = {QUEUE_WAIT: waited_s, **phases, REST: own_s - sum(phases.values())}
    ends = [r.finished_at for r in run.stages.values() if r.finished_at is not None]
    wall_s = max(ends) - run.created_at
    totals = {c: sum(row[c] for row in rows.values()) for c in COLUMNS}
    between_s = wall_s - sum(totals.values())
    return {
        "run_id": run.id,
        "status": run.status.value,
        "wall_s": _round(wall_s),
        "stages": [
            {"stage": name, **{c: _round(v) for c, v in row.items()}} for name, row in rows.items()
        ],
        "between_s": _round(between_s),
        "totals": {c: _round(v) for c, v in totals.items()},
        "shares": {
            c: round(v / wall_s, 4) + 0.0 for c, v in {**totals, "between_s": between_s}.items()
        },
    }


def _own_s(record: StageRecord) -> float:
    """The stage's own time: of each iteration of a looped stage, or of its one execution."""
    spans = [(i.started_at, i.finished_at) for i in record.iterations]
    if not spans or record.started_at not in [began for began, _ in spans]:
        spans.append((record.started_at, record.finished_at))  # a stage, or an iteration running
    return sum(end - began for began, end in spans if began is not None and end is not None)


def _round(value: float) -> float:
    return round(value, 3) + 0.0  # a sum that rounds to nothing is 0.0, not -0.0


def one_run(case: Case, settings: Settings, store: RunStore, order: list[str]) -> dict[str, Any]:
    """Enqueue `case`, wait for its end, and take its anatomy; `caller_wall_s` is from the
    enqueue call to the run's end as its caller saw it."""
    began = time.monotonic()
    run_id = api.enqueue(case.payload, repo=case.repo, ref=case.ref, pipeline=PIPELINE,
                         environment=case.environment, force=True, settings=settings)  # fmt: skip
    deadline = began + RUN_TIMEOUT_S
    while not (run := store.get(run_id)).status.is_terminal:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} ({case.name}) did not end within {RUN_TIMEOUT_S}s")
        time.sleep(POLL_S)
    caller_wall_s = time.monotonic() - began
    if run.status != RunStatus.DONE:
        raise RuntimeError(f"run {run_id} ({case.name}) ended {run.status.value}: {run.reason}")
    return {"case": case.name, "caller_wall_s": _round(caller_wall_s),
            **anatomy(run, store.audit_log(run_id), order)}  # fmt: skip


RUNTIMES = ("runc", "runsc")
"""Docker's default runtime, then gVisor's (`BATON_SANDBOX__RUNTIME`), a fresh worker each."""


def run(progress: Any) -> dict[str, Any]:
    per_pass = 1 + WARM_RUNS + 2 * len(CORPUS)
    task = progress.add_task("anatomy: fixer runs, one at a time",
                             total=per_pass * len(RUNTIMES))  # fmt: skip
    order = [stage.name for stage in load_pipeline(PIPELINE).stages]
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(_instant(json.loads(SCENARIO.read_text()))))
        settings = bench_settings(
            stack.enter_context(services.redis_server(work / "redis")), fake.url, work
        )
        store = RunStore.from_url(settings.redis_section())
        stack.callback(store.redis.close)
        demo = Case("demo", str(make_sample_repo(work / "shopcart.git")), SENTRY_EVENT.read_bytes())
        passes = []
        for runtime in RUNTIMES:
            with services.worker(
                {**worker_env(settings), "BATON_SANDBOX__RUNTIME": runtime},
                [stage.queue for stage in load_pipeline(PIPELINE).stages],
                logfile=work / f"worker-{runtime}.log",
            ):
                fake.set_scenario(_instant(json.loads(SCENARIO.read_text())))
                passes.append(_one_pass(runtime, demo, settings, store, order, fake, work,
                                        lambda: progress.advance(task)))  # fmt: skip
    return {"latency_ms": 0, "warm_runs": WARM_RUNS, "passes": passes}


def _one_pass(
    runtime: str,
    demo: Case,
    settings: Settings,
    store: RunStore,
    order: list[str],
    fake: FakeGemini,
    work: Path,
    advance: Any,
) -> dict[str, Any]:
    """The demo's first run on a fresh worker and the median of its warm runs, then each corpus
    instance's second run, on a worker whose sandboxes run under `runtime`."""
    first = one_run(demo, settings, store, order)
    advance()
    warm = []
    for _ in range(WARM_RUNS):
        warm.append(one_run(demo, settings, store, order))
        advance()
    median = sorted(warm, key=lambda r: r["wall_s"])[len(warm) // 2]
    runs = [
        {"label": "demo, first run on a fresh worker (`make demo`)", **first},
        {"label": f"demo, the median of {WARM_RUNS} runs on a warm worker", **median},
    ]
    for instance in load_corpus(CORPUS_ROOT, CORPUS):
        fake.set_scenario(_instant(scenario([instance], "oracle")))
        checkout = materialize(instance, work / "repos", DOWNLOADS.resolve())
        case = Case(instance.id, str(checkout.remote), instance.issue, ref=checkout.commit,
                    environment=instance.environment)  # fmt: skip
        one_run(case, settings, store, order)  # builds the environment image if need be
        advance()
        again = one_run(case, settings, store, order)
        runs.append({"label": f"{instance.id}, its second run (oracle policy)", **again})
        advance()
    return {"runtime": runtime, "warm_walls_s": [r["wall_s"] for r in warm], "runs": runs}


def _instant(scenario: dict[str, Any]) -> dict[str, Any]:
    return {**scenario, "latency_ms": 0}


HEADER = ["stage", *(LABELS[c] for c in COLUMNS), "stage total"]


def run_table(source: Source, run: Mapping[str, Any]) -> str:
    """One run: stage × column in seconds, the run's totals, and each column's share."""
    rows = []
    for stage in run["stages"]:
        total = source.derive(round(sum(stage[c] for c in COLUMNS), 3))
        rows.append([stage["stage"], *(f"{stage[c]:.2f}" for c in COLUMNS), f"{total:.2f}"])
    between = run["between_s"]
    rows.append(["between stages", *("" for _ in COLUMNS), f"{between:.2f}"])
    rows.append(["**all**", *(f"{run['totals'][c]:.2f}" for c in COLUMNS), f"{run['wall_s']:.2f}"])
    shares = {column: share + 0.0 for column, share in run["shares"].items()}  # no -0.0 %
    rows.append(["**share of the run**", *(f"{shares[c]:.1%}" for c in COLUMNS),
                 f"between stages {shares['between_s']:.1%}"])  # fmt: skip
    caption = (f"**{run['label']}** (run {run['run_id']}): {run['wall_s']:.2f} s from the run's "
               f"creation to its last stage's end; {run['caller_wall_s']:.2f} s from the enqueue "
               "call to the end as the caller saw it")  # fmt: skip
    return f"{caption}\n\n{table(HEADER, rows)}"


OVERHEAD = (REST, timings.SANDBOX_START, timings.COPY_IN)
"""What the issue's target adds up: Baton's own, sandbox start and copy-in."""
TARGET_HEADER = ["sandboxes", "run", "Baton's own + sandbox start + copy-in (s)",
                 "test runs (s)", "under the test runs"]  # fmt: skip
RUNTIME_NAMES = {"runc": "runc (Docker's default)", "runsc": "runsc (gVisor)"}


def target_table(source: Source) -> str:
    """Per run: Baton's own time, sandbox start and copy-in together against its test runs."""
    rows = []
    for one in source["passes"]:
        for run in one["runs"]:
            overhead = source.derive(round(sum(run["totals"][c] for c in OVERHEAD), 3))
            tests = run["totals"][timings.COMMANDS]
            rows.append([one["runtime"], run["label"], f"{overhead:.2f}", f"{tests:.2f}",
                         "yes" if overhead < tests else "no"])  # fmt: skip
    return table(TARGET_HEADER, rows)


def latest(source: Source) -> str:
    """The target's table, then every run of the latest recorded benchmark, a table each
    (seconds, and shares), by runtime."""
    setup = f"fake model at latency {source['latency_ms']} ms"
    parts = [f"{latest_run(source, setup)}:", target_table(source)]
    for one in source["passes"]:
        walls = ", ".join(f"{w:.2f}" for w in one["warm_walls_s"])
        parts.append(f"**Sandboxes under {RUNTIME_NAMES.get(one['runtime'], one['runtime'])}** "
                     f"(warm runs' walls: {walls} s)")  # fmt: skip
        parts += [run_table(source, run) for run in one["runs"]]
    return "\n\n".join(parts)


SECTIONS = {"latest": latest}

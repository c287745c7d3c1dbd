"""Fleet-wide quota: four workers share a model quota the fake server enforces (120 requests per
sliding minute; over it, a 429 with the time until the window has room).

Twelve runs of a chain of one-call stages are enqueued at once, twice: with the governor told
the quota (`BATON_QUOTAS`), and without (the workers learn only from 429s, whose cooldown the
fleet shares). Measured: the requests the server refused with 429, the quota's utilisation, and
the wall time until every run ended.

Utilisation is counted over the whole minutes of the busy period (from the first request to
the last): requests served in them / (quota × minutes). A sliding-window quota allows a burst
at the start of any minute, so a busy period's last, partial minute says nothing and is left
out; the workload is sized to keep the fleet waiting on the quota for two whole minutes.
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import record
from bench.stack import bench_settings, empty_repo
from orchestrator import api
from orchestrator.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

MODEL = "gemini-2.5-flash"
QUOTA_RPM = 120
WINDOW_S = 60.0
RUNS = 12
STAGES = 21
"""Per run; 12 × 21 = 252 calls: two full minutes of the quota and a dozen more."""
WORKERS = 4
VARIANTS = {"on": "governor on (quota configured)", "off": "governor off (429s only)"}
RUN_TIMEOUT_S = 400.0


def pipeline_toml(stages: int) -> str:
    """A chain of stages without tools: one model call each."""
    lines = ['name = "bench-governor"', 'description = "A chain of one-call stages."']
    for n in range(1, stages + 1):
        before = "{issue}" if n == 1 else f"Before you: {{q{n - 1}}}"
        lines += [
            "",
            "[[stages]]",
            f'name = "q{n}"',
            'output_schema = "orchestrator.schemas:Summary"',
            f'instruction = "Stage {n}. {before}"',
        ]
    return "\n".join(lines) + "\n"


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("governor: quota on, then 429s only", total=len(VARIANTS) * RUNS)
    figures: dict[str, Any] = {
        "quota_rpm": QUOTA_RPM,
        "runs": RUNS,
        "stages": STAGES,
        "workers": WORKERS,
    }
    for variant in VARIANTS:
        figures[variant] = measure(variant == "on", lambda: progress.advance(task))
    return figures


def measure(governed: bool, advance: Any) -> dict[str, Any]:
    """One variant on its own redis-server, fake server and workers."""
    scenario = {
        "agents": {"*": [{"json": {"summary": "ok"}}]},
        "quota": {"requests_per_minute": QUOTA_RPM, "window_s": WINDOW_S},
    }
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(scenario))
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        pipeline = work / "governor.toml"
        pipeline.write_text(pipeline_toml(STAGES))
        env = worker_env(settings)
        if governed:
            env["BATON_QUOTAS"] = json.dumps({MODEL: {"requests_per_minute": QUOTA_RPM}})
        queues = [f"baton.q{n}" for n in range(1, STAGES + 1)]
        for n in range(WORKERS):
            stack.enter_context(
                services.worker(
                    env, queues, logfile=work / f"worker-{n}.log", name=f"bench-governor-{n}"
                )
            )
        repo = empty_repo(work / "repo")
        store = RunStore.from_url(redis_url)
        stack.callback(store.redis.close)
        started = time.monotonic()
        ids = [
            api.enqueue(
                f"Governor run {i}", repo=str(repo), pipeline=str(pipeline), settings=settings
            )
            for i in range(RUNS)
        ]
        _wait_for_runs(store, ids, advance)
        wall_s = time.monotonic() - started
        entries = fake.requests()
    return summarize(entries, wall_s)


def _wait_for_runs(store: RunStore, ids: list[str], advance: Any) -> None:
    pending, deadline = set(ids), time.monotonic() + RUN_TIMEOUT_S
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} governor runs did not end in {RUN_TIMEOUT_S:.0f}s")
        for run_id in sorted(pending):
            run = store.get(run_id)
            if run.status.is_terminal:
                if run.status.value != "done":
                    raise RuntimeError(f"governor run {run_id} ended {run.status}: {run.reason}")
                pending.discard(run_id)
                advance()
        time.sleep(0.2)


def summarize(entries: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    served = sorted(e["ts"] for e in entries if e["status"] == 200)
    return {
        "served": len(served),
        "refused_429": sum(1 for e in entries if e["status"] == 429),
        "utilisation": round(utilisation(served), 3),
        "busiest_minute": busiest_window(served),
        "wall_s": round(wall_s, 1),
    }


def utilisation(times: list[float]) -> float:
    """Requests served in the busy period's whole minutes / (quota × minutes)."""
    minutes = int((times[-1] - times[0]) // WINDOW_S)
    if minutes == 0:
        return len(times) / QUOTA_RPM
    end = times[0] + minutes * WINDOW_S
    return sum(1 for t in times if t < end) / (QUOTA_RPM * minutes)


def busiest_window(times: list[float]) -> int:
    """The most requests served within any one sliding minute (at most the quota)."""
    return max(sum(1 for t in times[i:] if t < start + WINDOW_S) for i, start in enumerate(times))


def write(figures: dict[str, Any]) -> None:
    on, off = figures["on"], figures["off"]
    detail = record.table(
        ["", "requests served", "refused with 429", "utilisation", "busiest minute", "wall (s)"],
        [
            [
                label,
                str(figures[variant]["served"]),
                str(figures[variant]["refused_429"]),
                f"{figures[variant]['utilisation']:.1%}",
                f"{figures[variant]['busiest_minute']} / {figures['quota_rpm']}",
                f"{figures[variant]['wall_s']:.1f}",
            ]
            for variant, label in VARIANTS.items()
        ],
    )
    row = [
        str(on["refused_429"]),
        f"{on['utilisation']:.1%}",
        f"{on['wall_s']:.1f}",
        str(off["refused_429"]),
        f"{off['utilisation']:.1%}",
        f"{off['wall_s']:.1f}",
    ]
    record.save("governor", figures, row, detail)

"""Fleet-wide quota: four workers share a model quota that the fake server enforces.

Ten runs of a chain of 20 one-call stages (200 model calls) are enqueued at once, against an
instant model, in four set-ups, each with its own fake server, redis-server and four worker
processes:

* **matched**: the fleet is told the quota (`BATON_QUOTAS`, 120 requests per minute) and the
  server enforces the same 120 over a sliding minute;
* **over**: the fleet believes 120 per minute, but the server allows only 100 per clock
  minute (fixed windows, as providers count): the fleet has to learn from the 429s;
* **over, sliding**: the same, the server counting 100 over a sliding minute;
* **off**: no quota configured; the server enforces 120 over a sliding minute and the workers
  learn only from its 429s (the cooldown a 429 sets is shared by the fleet).

`matched` runs alone first: the governor's margin for the time between a permit and the
request's arrival (`WINDOW_MARGIN_S`) assumes a machine that is not overloaded, and three
fleets of an instant model on two cores overload it. The other three then run side by side.

Measured from the server's own record: requests served and refused with 429, the quota's
utilisation, 429s per clock minute, and the wall time until every run ended.

Minutes are the server's windows: clock minutes for a fixed window, minutes from the first
request for a sliding one. Utilisation is the requests served in the whole minutes of the busy
period / (the server's quota × those minutes).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED, STACK
from bench.stack import bench_settings, empty_repo, together
from orchestrator.control import api
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import DEFAULT_MODEL
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CODE: tuple[str, ...] = ("bench/governor.py", *STACK, *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

MODEL = DEFAULT_MODEL
"""The model the workers call (their default), whose quota the runs configure."""
WINDOW_S = 60.0
RUNS = 10
STAGES = 20
"""Per run; 10 × 20 = 200 calls: two minutes of a 100-per-minute quota."""
WORKERS = 4
RUN_TIMEOUT_S = 480.0
MAX_REFUSED_SHARE = 0.02
"""Target of `over`: at most this share of all calls refused with 429."""
MAX_LATER_429S_PER_MINUTE = 1
"""Target of `over`: after the clock minute of the first 429, at most this many 429s in any
clock minute (no storm; the fleet may probe its way back up now and then)."""
MIN_UTILISATION = 0.9
"""Target of `matched`: at least this share of the quota used."""


@dataclass(frozen=True)
class Variant:
    label: str
    fleet_rpm: int | None
    """The quota the fleet is told (`BATON_QUOTAS`); None: none."""
    server_rpm: int
    window: str
    """The server's window: `sliding` or `fixed`."""


VARIANTS = {
    "matched": Variant("fleet told 120/min; server allows 120 per sliding minute", 120, 120,
                       "sliding"),
    "over": Variant("fleet told 120/min; server allows 100 per clock minute", 120, 100, "fixed"),
    "over_sliding": Variant("fleet told 120/min; server allows 100 per sliding minute", 120, 100,
                            "sliding"),
    "off": Variant("no quota configured (429s only); server 120 per sliding minute", None, 120,
                   "sliding"),
}  # fmt: skip


def pipeline_toml(stages: int) -> str:
    """A chain of stages without tools: one model call each."""
    lines = ['name = "bench-governor"', 'description = "A chain of one-call stages."']
    for n in range(1, stages + 1):
        before = "{issue}" if n == 1 else f"Before you: {{q{n - 1}}}"
        lines += [
            "",
            "[[stages]]",
            f'name = "q{n}"',
            'output_schema = "orchestrator.pipelines.schemas:Summary"',
            f'instruction = "Stage {n}. {before}"',
        ]
    return "\n".join(lines) + "\n"


GROUPS = (("matched",), ("over", "over_sliding", "off"))
"""Set-ups run side by side, one group after the other."""


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("governor: matched, then the others side by side",
                             total=len(VARIANTS) * RUNS)  # fmt: skip
    figures: dict[str, Any] = {"runs": RUNS, "stages": STAGES, "workers": WORKERS}
    for group in GROUPS:
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            futures = {
                name: pool.submit(measure, VARIANTS[name], lambda: progress.advance(task))
                for name in group
            }
            for name, future in futures.items():
                figures[name] = future.result()
    figures["targets"] = targets(figures)
    return figures


def measure(variant: Variant, advance: Callable[[], object]) -> dict[str, Any]:
    """One variant on its own redis-server, fake server and workers."""
    quota = {"requests_per_minute": variant.server_rpm, "window_s": WINDOW_S,
             "window": variant.window}  # fmt: skip
    scenario = {"agents": {"*": [{"json": {"summary": "ok"}}]}, "quota": quota}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(scenario))
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        pipeline = work / "governor.toml"
        pipeline.write_text(pipeline_toml(STAGES))
        env = worker_env(settings)
        if variant.fleet_rpm is not None:
            env["BATON_QUOTAS"] = json.dumps({MODEL: {"requests_per_minute": variant.fleet_rpm}})
        queues = [stage.queue for stage in load_pipeline(str(pipeline)).stages]
        workers = [
            services.worker(env, queues, logfile=work / f"worker-{n}.log", name=f"governor-{n}")
            for n in range(WORKERS)
        ]
        stack.enter_context(together(workers))
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
    return summarize(entries, wall_s, variant)


def _wait_for_runs(store: RunStore, ids: list[str], advance: Callable[[], object]) -> None:
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


def summarize(entries: list[dict[str, Any]], wall_s: float, variant: Variant) -> dict[str, Any]:
    """The server's view of one set-up, in the server's windows: clock minutes for a fixed
    window, minutes from the first request for a sliding one."""
    origin = min(e["ts"] for e in entries)
    if variant.window == "fixed":
        origin = math.floor(origin / WINDOW_S) * WINDOW_S
    served = sorted(e["ts"] for e in entries if e["status"] == 200)
    refused = sorted(e["ts"] for e in entries if e["status"] == 429)
    per_minute = minutes(served, origin)
    refused_per_minute = Counter(math.floor((ts - origin) / WINDOW_S) for ts in refused)
    first = min(refused_per_minute, default=None)
    later = [n for minute, n in refused_per_minute.items() if first is not None and minute > first]
    # The last minute is partial; so is a fixed window's first, unless the burst began with it.
    whole = per_minute[1 if variant.window == "fixed" else 0 : -1]
    return {
        "server_quota_rpm": variant.server_rpm,
        "server_window": variant.window,
        "calls": len(entries),
        "served": len(served),
        "refused_429": len(refused),
        "refused_share": round(len(refused) / len(entries), 4),
        "first_429_s": round(refused[0] - min(served + refused), 1) if refused else None,
        "refused_in_first_minute": refused_per_minute[first] if first is not None else 0,
        "max_later_429s_per_minute": max(later, default=0),
        "served_per_minute": per_minute,
        "utilisation": round(sum(whole) / (variant.server_rpm * len(whole)), 3) if whole else None,
        "wall_s": round(wall_s, 1),
    }


def minutes(times: list[float], origin: float) -> list[int]:
    """Requests in each minute from `origin` to the last one."""
    counts = Counter(math.floor((ts - origin) / WINDOW_S) for ts in times)
    return [counts[m] for m in range(max(counts, default=-1) + 1)]


def targets(figures: dict[str, Any]) -> dict[str, Any]:
    matched = figures["matched"]
    found = {
        "matched_no_429": {"target": "0", "value": matched["refused_429"],
                           "met": matched["refused_429"] == 0},
        "matched_utilisation": {"target": f">= {MIN_UTILISATION}",
                                "value": matched["utilisation"],
                                "met": (matched["utilisation"] or 0) >= MIN_UTILISATION},
    }  # fmt: skip
    for name in ("over", "over_sliding"):
        share, later = figures[name]["refused_share"], figures[name]["max_later_429s_per_minute"]
        found[f"{name}_refused_share"] = {
            "target": f"<= {MAX_REFUSED_SHARE}",
            "value": share,
            "met": share <= MAX_REFUSED_SHARE,
        }
        found[f"{name}_no_storm"] = {
            "target": f"<= {MAX_LATER_429S_PER_MINUTE} per later minute",
            "value": later,
            "met": later <= MAX_LATER_429S_PER_MINUTE,
        }
    return found


HISTORY = ["matched: 429s", "matched: utilisation", "over: 429s",
           "over: most 429s in a later minute", "over: utilisation", "over, sliding: 429s",
           "off: 429s", "targets met"]  # fmt: skip
"""The history table's columns after the date and commit (`row`)."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    matched, over, off = source["matched"], source["over"], source["off"]
    sliding = source["over_sliding"]
    return [
        str(matched["refused_429"]),
        _share(matched["utilisation"]),
        f"{over['refused_429']} ({over['refused_share']:.1%})",
        str(over["max_later_429s_per_minute"]),
        _share(over["utilisation"]),
        f"{sliding['refused_429']} ({sliding['refused_share']:.1%})",
        str(off["refused_429"]),
        "yes" if all(t["met"] for t in source["targets"].values()) else "**no**",
    ]


def latest(source: Source) -> str:
    """The latest run: each set-up's calls, 429s, utilisation and minutes, then the targets."""
    rows = []
    for name, variant in VARIANTS.items():
        f = source[name]
        rows.append(
            [
                f"**{name}**: {variant.label}",
                str(f["calls"]),
                f"{f['refused_429']} ({f['refused_share']:.1%})",
                str(f["refused_in_first_minute"]),
                str(f["max_later_429s_per_minute"]),
                _share(f["utilisation"]) + f" of {f['server_quota_rpm']}",
                " / ".join(str(n) for n in f["served_per_minute"]),
                f"{f['wall_s']:.0f}",
            ]
        )
    per_setup = (
        f"{source['workers']} worker processes, {source['runs']} runs of {source['stages']} "
        "one-call stages per set-up"
    )
    header = ["set-up", "calls", "429s", "429s in the first 429's minute",
              "most 429s in a later minute", "utilisation", "served per minute",
              "wall (s)"]  # fmt: skip
    return (
        f"{latest_run(source, per_setup)}:\n\n{table(header, rows)}"
        f"\n\n{targets_table(source['targets'])}"
    )


SECTIONS = {"latest": latest}


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"

"""Soak: whole fixer runs while worker processes are SIGKILLed, at Baton's default settings.

The demo's fixer pipeline with its Docker sandboxes, the fake model answering in 300 ms. Two
workers of two pool processes each serve every stage. `RUNS` runs arrive one every
`ARRIVAL_S`; from the first arrival until the last run has ended, every `KILL_EVERY_S` one
worker, chosen at random (seeded), has its whole process group SIGKILLed (main process and
pool, mid-stage or idle) and a fresh one is started in its place. The kills are thus spread
evenly over the whole soak, its recovery tail included, not front-loaded.

Nothing about recovery is relaxed: lease, reconcile interval, stuck-after and max interruptions
are `QueueConfig`'s defaults (recorded in the result), so a lost stage waits for its lease to
lapse and the next sweep, as in production.

Reported: runs, kills, stages interrupted, losses (runs not done, or done without every
stage's output: must be 0), duplicates (a stage recorded done twice, a second branch or a
second commit for a run: must be 0) and the wall time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import sandbox
from bench.docs import Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import bench_settings
from demo import SCENARIO, SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.models import RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import QueueConfig, Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

CODE: tuple[str, ...] = ("bench/soak.py", *STACK, "demo/", "sandbox/", "images/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

RUNS = 60
ARRIVAL_S = 4.0
KILL_EVERY_S = 30.0
"""At every 15 s, a trial run lost one run of 24 by design: a stage killed three times gives up
(`max_interrupted`), and with a kill every 15 s and recovery taking up to a minute, a re-run
stage is often hit again."""
WORKERS, CONCURRENCY = 2, 2
LATENCY_MS = 300
SEED = 20261201
TIMEOUT_S = 900.0
STAGES = [stage.name for stage in load_pipeline("fixer").stages]


class Fleet:
    """The workers of the soak: started, killed and replaced."""

    def __init__(self, stack: ExitStack, settings: Settings, work: Path) -> None:
        self._stack, self._env, self._work = stack, worker_env(settings), work
        self._queues = [stage.queue for stage in load_pipeline("fixer").stages]
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self) -> None:
        log = self._work / f"worker-{self.started}.log"
        self.started += 1
        self.workers.append(
            self._stack.enter_context(
                services.worker(self._env, self._queues, concurrency=CONCURRENCY, logfile=log)
            )
        )

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a random worker's whole process group and start another in its place."""
        victim = self.workers.pop(rng.randrange(len(self.workers)))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        self.start()


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task(
        f"soak: runs done (a worker SIGKILLed every {KILL_EVERY_S:g} s)", total=RUNS
    )
    rng = random.Random(SEED)
    kills: list[float] = []
    scenario = {**json.loads(SCENARIO.read_text()), "latency_ms": LATENCY_MS}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        fake = stack.enter_context(FakeGemini.start(scenario))
        settings = bench_settings(
            stack.enter_context(services.redis_server(work / "redis")), fake.url, work
        )
        remote = make_sample_repo(work / "shopcart.git")
        fleet = Fleet(stack, settings, work)
        for _ in range(WORKERS):
            fleet.start()
        store = RunStore.from_url(settings.redis_section())
        stack.callback(store.redis.close)
        with _removing_sandboxes() as run_ids:
            started = time.monotonic()
            next_run, next_kill = started, started + KILL_EVERY_S
            while len(run_ids) < RUNS or _ended(store, run_ids) < RUNS:
                progress.update(task, completed=_ended(store, run_ids))
                now = time.monotonic()
                if now - started > TIMEOUT_S:
                    raise RuntimeError(f"the soak did not finish within {TIMEOUT_S:.0f}s")
                if len(run_ids) < RUNS and now >= next_run:
                    run_ids.append(api.enqueue(SENTRY_EVENT.read_bytes(), repo=str(remote),
                                               settings=settings, force=True))  # fmt: skip
                    next_run += ARRIVAL_S
                if now >= next_kill:
                    fleet.kill_one(rng)
                    kills.append(round(now - started, 1))
                    next_kill += KILL_EVERY_S
                time.sleep(0.2)
            wall_s = time.monotonic() - started
            figures = check(store, remote, run_ids)
            figures["lost_logs"] = {run_id: worker_lines(work, run_id)
                                    for run_id, _reason in figures["lost"]}  # fmt: skip
    return {
        "runs": RUNS,
        "arrival_every_s": ARRIVAL_S,
        "kill_every_s": KILL_EVERY_S,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
        "model_latency_ms": LATENCY_MS,
        "settings": settings.queue.model_dump(),
        "settings_are_defaults": settings.queue == QueueConfig(),
        "kills": len(kills),
        "kill_times_s": kills,
        "wall_s": round(wall_s, 1),
        **figures,
        "met": figures["losses"] == 0 and figures["duplicates"] == 0,
    }


def _ended(store: RunStore, run_ids: list[str]) -> int:
    return sum(1 for _, run in store.get_each(run_ids) if run and run.status.is_terminal)


@contextmanager
def _removing_sandboxes() -> Iterator[list[str]]:
    """The soak's run ids; any sandbox of theirs a killed worker left is removed at the end."""
    run_ids: list[str] = []
    try:
        yield run_ids
    finally:
        for run_id in run_ids:
            try:
                sandbox.remove_labelled({"baton.run": run_id})
            except sandbox.SandboxError:
                pass


def check(store: RunStore, remote: Path, run_ids: list[str]) -> dict[str, Any]:
    """Losses and duplicates, from the run store, the audit logs and the remote's branches."""
    if len(set(run_ids)) != len(run_ids):
        raise RuntimeError("the soak enqueued one run more than once (idempotency key)")
    runs = [store.get(run_id) for run_id in run_ids]
    branches = _git(remote, "for-each-ref", "--format=%(refname:short)", "refs/heads/baton/")
    lost = [r.id for r in runs if r.status != RunStatus.DONE]
    lost += [r.id for r in runs if r.status == RunStatus.DONE
             and any(store.output(r.id, s) is None for s in STAGES)]  # fmt: skip
    duplicates = sum(max(0, len(_done_entries(store, r.id, s)) - 1) for r in runs for s in STAGES)
    duplicates += len(set(branches.split()) - {f"baton/{r.id}" for r in runs})
    duplicates += sum(
        int(_git(remote, "rev-list", "--count", f"main..baton/{r.id}")) - 1
        for r in runs
        if f"baton/{r.id}" in branches.split()
    )
    return {
        "done": sum(1 for r in runs if r.status == RunStatus.DONE),
        "losses": len(lost),
        "lost": [(r, store.get(r).reason) for r in lost],
        "duplicates": duplicates,
        "branches": len(branches.split()),
        "stages_interrupted": sum(r.stages[s].interrupted for r in runs for s in STAGES),
    }


LOST_LOG_CHARS = 6_000


def worker_lines(work: Path, run_id: str) -> str:
    """What the workers logged of a run that was not done, with the traceback of a crash: the
    soak's folder goes when it ends, so a loss would leave no evidence otherwise."""
    kept: list[str] = []
    for log in sorted(work.glob("worker-*.log")):
        following = False
        for line in log.read_text(errors="replace").splitlines():
            if run_id in line:
                kept.append(f"{log.name}: {line}")
                following = "crashed" in line or "Traceback" in line
            elif following and not line.startswith("["):  # a traceback's lines
                kept.append(f"{log.name}: {line}")
            else:
                following = False
    return "\n".join(kept)[-LOST_LOG_CHARS:]


def _done_entries(store: RunStore, run_id: str, stage: str) -> list[dict[str, Any]]:
    return [
        e for e in store.audit_log(run_id)
        if e["kind"] == "stage_done" and e["branch"] == f"fixer.{stage}"
    ]  # fmt: skip


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


HISTORY = ["runs", "kills", "stages interrupted", "losses", "duplicates", "wall (s)"]
"""The history table's columns after the date and commit (`row`)."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    return [
        str(source["runs"]),
        str(source["kills"]),
        str(source["stages_interrupted"]),
        str(source["losses"]),
        str(source["duplicates"]),
        f"{source['wall_s']:.0f}",
    ]


def latest(source: Source) -> str:
    """The latest run: its settings and arrivals, what it found, when the kills came."""
    q = source["settings"]
    settings = (
        f"lease {q['lease_s']:g} s, reconcile every {q['reconcile_every_s']:g} s, stuck after "
        f"{q['stuck_after_s']:g} s, max interrupted {q['max_interrupted']}"
    )
    which = "the defaults" if source.get("settings_are_defaults") else "**not** the defaults"
    text = (
        f"{latest_run(source)}: {source['runs']} runs arriving every "
        f"{source['arrival_every_s']:g} s, {source['workers']} workers of "
        f"{source['concurrency']} pool processes, one killed every {source['kill_every_s']:g} s, "
        f"the model answering in {source['model_latency_ms']} ms.\n\n"
    )
    text += table(
        ["runs", "done", "kills", "stages interrupted", "losses", "duplicates", "wall (s)",
         f"settings ({which})"],
        [[str(source["runs"]), str(source["done"]), str(source["kills"]),
          str(source["stages_interrupted"]), str(source["losses"]), str(source["duplicates"]),
          f"{source['wall_s']:.0f}", settings]],
    )  # fmt: skip
    text += "\n\nKills at (s from the first arrival): " + ", ".join(
        f"{t:g}" for t in source["kill_times_s"]
    )
    for run_id, reason in source["lost"]:
        text += f"\n\nNot done: run {run_id}: {reason} (its workers' log lines: `lost_logs` in "
        text += f"{source.path})"
    return text


SECTIONS = {"latest": latest}

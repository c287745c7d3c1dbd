"""Recovery and control with real processes: resume, cancel, SIGTERM, SIGKILL soak, Redis
restart. Each test runs its own workers on its own Redis database (or server)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.services import worker_env
from tests.containers import sandboxes
from tests.repos import Git
from tests.twin import FIXER_SPEC

from .conftest import Stack, demo_scenario, stack_settings, wrong_fix_first

STAGES = ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]
ROOT = Path(__file__).resolve().parents[2]
QUEUES = [f"baton.fixer.{s}" for s in STAGES]
FAST_RECOVERY = {
    "BATON_QUEUE__LEASE_S": "6",
    "BATON_QUEUE__RECONCILE_EVERY_S": "1",
    "BATON_QUEUE__STUCK_AFTER_S": "5",
}
"""Relaxed recovery settings (defaults: lease 30 s, reconcile every 30 s, stuck after 120 s), so
that a stage lost with its worker is back within seconds rather than up to a minute and these
tests finish in a test's time. `python -m bench soak` soaks the defaults."""


@pytest.fixture
def own_db(
    redis_url: str, stack: Stack, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A Stack on a database of its own (chosen per test), flushed before and after."""
    db = 10 + hash(request.node.name) % 5
    settings = stack_settings(redis_url.rsplit("/", 1)[0] + f"/{db}", stack.fake, tmp_path)
    client = redis.Redis.from_url(settings.require_redis_url())
    client.flushdb()
    yield Stack(settings, stack.fake, tmp_path)
    client.flushdb()
    client.close()


def test_resume_after_a_failed_fix_reruns_only_fix_and_pr(
    stack: Stack, run_store: RunStore, git: Git, tmp_path: Path
) -> None:
    fixer = FIXER_SPEC.read_text()
    once = tmp_path / "fixer-once.toml"  # relaxed: one iteration, the loop is not the point here
    once.write_text(fixer.replace("max_iterations = 3", "max_iterations = 1"))
    stack.fake.set_scenario(wrong_fix_first())
    repo = stack.sample_repo()
    failed = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo, pipeline=str(once)))
    assert failed.status == RunStatus.FAILED and failed.reason is not None
    assert failed.reason.startswith("fix: the reproducing tests still fail")
    stack.fake.set_scenario(demo_scenario())
    stack.fake.reset()

    assert api.resume(failed.id, settings=stack.settings) == "fix"
    run = stack.wait(failed.id)

    assert run.status == RunStatus.DONE, run.reason
    assert {entry["agent"] for entry in stack.requests()} == {"fix", "review", "pr"}
    assert [run.stages[s].attempts for s in STAGES] == [1, 1, 1, 1, 2, 1, 1]
    assert run_store.output(run.id, "plan") is not None
    assert git("branch", "--list", "baton/*", cwd=repo) == f"baton/{run.id}"


def test_a_worker_killed_during_a_fix_iteration_resumes_that_iteration_once(
    own_db: Stack, git: Git
) -> None:
    """SIGKILL while the fix's second iteration waits for its second model call (held 30 s by
    the fake server): the reconciler sends `<run>.fix.2` again to another worker, iteration 1
    is not run again, and one branch is published."""
    scenario = wrong_fix_first()
    first_iteration_calls = len(scenario["agents"]["fix"]["steps"])
    own_db.fake.set_scenario(scenario)
    own_db.fake.set_faults(
        [{"agent": "fix", "requests": [first_iteration_calls + 2], "latency_ms": 30_000}]
    )
    env = {**worker_env(own_db.settings), **FAST_RECOVERY}
    remote = own_db.sample_repo()
    with ExitStack() as stack:
        victim = stack.enter_context(
            services.worker(env, QUEUES, logfile=own_db.workdir / "first.log")
        )
        run_id = own_db.enqueue(SENTRY_EVENT.read_bytes(), remote)
        deadline = time.monotonic() + 120
        while len(own_db.requests("fix")) < first_iteration_calls + 2:
            assert time.monotonic() < deadline, "the fix's second iteration never got going"
            time.sleep(0.1)
        held = api.get_run(run_id, settings=own_db.settings).stages["fix"]
        assert (held.status, held.iteration, held.attempts) == (StageStatus.RUNNING, 2, 2)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        stack.enter_context(services.worker(env, QUEUES, logfile=own_db.workdir / "second.log"))
        run = own_db.wait(run_id, timeout_s=150)

    assert run.status == RunStatus.DONE, run.reason
    fix = run.stages["fix"]
    assert [(i.number, i.attempt, i.passed) for i in fix.iterations] == [
        (1, 1, False),
        (2, 3, True),
    ]
    assert (fix.interrupted, fix.attempts) == (1, 3)
    store = RunStore.from_url(own_db.settings.require_redis_url())
    log = store.audit_log(run_id)
    store.redis.close()
    iterations = [json.loads(e["data"])["iteration"] for e in log if e["kind"] == "iteration_done"]
    assert iterations == [1, 2]  # each recorded once: nothing ran twice
    done = [e["branch"] for e in log if e["kind"] == "stage_done"]
    assert sorted(done) == sorted(f"fixer.{s}" for s in STAGES)
    assert run.stages["pr"].attempts == 1
    assert git("branch", "--list", "baton/*", cwd=remote).split() == [f"baton/{run_id}"]


def test_cancel_during_a_sandboxed_stage_leaves_no_container_and_a_cancelled_run(
    own_db: Stack,
) -> None:
    own_db.fake.set_faults([{"agent": "fix", "requests": [2], "latency_ms": 20_000}])
    env = {**worker_env(own_db.settings), **FAST_RECOVERY}
    with services.worker(env, QUEUES, logfile=own_db.workdir / "worker.log"):
        run_id = own_db.enqueue(SENTRY_EVENT.read_bytes(), own_db.sample_repo())
        deadline = time.monotonic() + 60
        while not sandboxes(run_id, "fix"):
            assert time.monotonic() < deadline, "the fix stage never started its sandbox"
            time.sleep(0.1)
        time.sleep(0.5)
        cancelled_at = time.monotonic()
        assert api.cancel(run_id, settings=own_db.settings) is True
        while (
            api.get_run(run_id, settings=own_db.settings).stages["fix"].status
            != StageStatus.CANCELLED
        ):
            assert time.monotonic() - cancelled_at < 15, "the fix stage did not stop"
            time.sleep(0.1)
        stopped_after = time.monotonic() - cancelled_at

    run = api.get_run(run_id, settings=own_db.settings)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "cancelled by request")
    assert sandboxes(run_id) == []
    assert stopped_after < 10, "the stage should stop at once, not when its model call ends"
    assert run.stages["pr"].status == StageStatus.PENDING


def test_sigterm_lets_the_running_stage_finish_and_the_run_goes_on_later(own_db: Stack) -> None:
    own_db.fake.set_faults([{"agent": "plan", "latency_ms": 3_000}])
    env = {**worker_env(own_db.settings), **FAST_RECOVERY}
    with services.worker(env, QUEUES, logfile=own_db.workdir / "first.log") as first:
        run_id = own_db.enqueue(SENTRY_EVENT.read_bytes(), own_db.sample_repo())
        deadline = time.monotonic() + 60
        while (
            api.get_run(run_id, settings=own_db.settings).stages["plan"].status
            != StageStatus.RUNNING
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    mid = api.get_run(run_id, settings=own_db.settings)
    own_db.fake.set_faults([])
    with services.worker(env, QUEUES, logfile=own_db.workdir / "second.log"):
        run = own_db.wait(run_id)

    assert mid.stages["plan"].status == StageStatus.DONE
    assert mid.stages["plan"].attempts == 1
    assert run.status == RunStatus.DONE, run.reason


@pytest.mark.timeout(900)
def test_a_soak_with_workers_killed_at_random_loses_and_duplicates_nothing(
    own_db: Stack, git: Git
) -> None:
    """Relaxed settings, on purpose: FAST_RECOVERY (a lost stage is back within seconds, not up
    to a minute) and 5 interruptions per stage instead of 3, because four kills 2–5 s apart, all
    in the first half minute, can hit one stage more than three times. The kills are
    front-loaded for the same reason: time, as is the size: 6 runs and 4 kills (each run is six
    stages with a reproduction and a proof; the kills all land while runs are in flight).
    `python -m bench soak` runs the soak at the default settings, with kills spread over the
    whole of it."""
    runs_wanted, kills_wanted = 6, 4
    own_db.fake.set_scenario({**demo_scenario(), "latency_ms": 150})
    env = {**worker_env(own_db.settings), **FAST_RECOVERY, "BATON_QUEUE__MAX_INTERRUPTED": "5"}
    remote = own_db.sample_repo()
    rng = random.Random(20261129)
    kills = 0
    with ExitStack() as stack:
        workers: list[Any] = []

        def start(n: int) -> None:
            log = own_db.workdir / f"worker-{n}.log"
            workers.append(
                stack.enter_context(services.worker(env, QUEUES, concurrency=2, logfile=log))
            )

        start(0)
        start(1)
        run_ids = [own_db.enqueue(SENTRY_EVENT.read_bytes(), remote) for _ in range(runs_wanted)]
        deadline = time.monotonic() + 600
        while not all(api.get_run(r, settings=own_db.settings).status.is_terminal for r in run_ids):
            assert time.monotonic() < deadline, "the soak did not finish"
            if kills < kills_wanted:
                time.sleep(rng.uniform(2.0, 5.0))
                victim = workers.pop(rng.randrange(len(workers)))
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()
                kills += 1
                start(kills + 1)
            else:
                time.sleep(0.5)

    store = RunStore.from_url(own_db.settings.require_redis_url())
    runs = [store.get(r) for r in run_ids]
    branches = git(
        "for-each-ref", "--format=%(refname:short)", "refs/heads/baton/", cwd=remote
    ).split()
    assert kills >= kills_wanted
    failed = [(r.id, r.reason) for r in runs if r.status != RunStatus.DONE]
    assert failed == []
    assert sorted(branches) == sorted(f"baton/{r.id}" for r in runs)
    for run in runs:
        assert git("rev-list", "--count", f"main..baton/{run.id}", cwd=remote) == "1"
        done = [e for e in store.audit_log(run.id) if e["kind"] == "stage_done"]
        assert sorted(e["branch"] for e in done) == sorted(f"fixer.{s}" for s in STAGES)
        assert all(store.output(run.id, s) is not None for s in STAGES)
    assert sum(r.stages[s].interrupted for r in runs for s in STAGES) >= 1
    store.redis.close()


class RedisServer:
    """A redis-server on a fixed port and directory, stopped and started again at will."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, services.free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--appendonly", "yes", "--appendfsync", "everysec",
                "--save", "", "--maxmemory-policy", "noeviction"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


@pytest.mark.timeout(400)
def test_redis_stopped_and_restarted_mid_runs_all_complete(stack: Stack, tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.workdir.mkdir()
    server.start()
    try:
        settings = Settings(**{**stack.settings.model_dump(), "redis_url": server.url,
                               "google_api_key": stack.settings.google_api_key})  # fmt: skip
        mine = Stack(settings, stack.fake, tmp_path)
        stack.fake.set_scenario({**demo_scenario(), "latency_ms": 100})
        env = {**worker_env(settings), **FAST_RECOVERY}
        with services.worker(env, QUEUES, concurrency=2, logfile=tmp_path / "worker.log"):
            run_ids = [
                mine.enqueue(SENTRY_EVENT.read_bytes(), mine.sample_repo()) for _ in range(6)
            ]
            time.sleep(3)
            server.stop()
            time.sleep(3)
            server.start()
            runs = [mine.wait(r, timeout_s=240) for r in run_ids]
    finally:
        server.stop()

    assert [r.status for r in runs] == [RunStatus.DONE] * 6, [r.reason for r in runs]
    assert all(r.stages["pr"].status == StageStatus.DONE for r in runs)
    assert json.dumps([r.reason for r in runs]) == json.dumps([None] * 6)


def test_the_cli_lists_runs_and_cancels(own_db: Stack) -> None:
    ids = [own_db.enqueue(f"Issue {n}: checkout fails", own_db.sample_repo()) for n in range(3)]
    env = {**os.environ, "BATON_REDIS_URL": own_db.settings.require_redis_url()}

    def baton(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestrator.control.cli", *args], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    cancelled = baton("cancel", ids[1])
    listed = json.loads(baton("runs", "--json").stdout)
    only = json.loads(baton("runs", "--status", "cancelled", "--json").stdout)
    again = baton("cancel", ids[1])

    assert cancelled.returncode == 0 and f"run {ids[1]} cancelled" in cancelled.stdout
    assert [r["run_id"] for r in listed] == list(reversed(ids))
    assert [r["run_id"] for r in only] == [ids[1]]
    assert again.returncode == 1 and "had already ended (cancelled)" in again.stderr

"""A cancel fences every side effect, whatever the timing: nothing is published, pushed or
recorded as done after the run is cancelled, even in a stage far shorter than the heartbeat's
interval (the shared worker runs with the default 30 s lease, so its heartbeat looks every
10 s: it never notices these cancels in time, the fences do)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.store import RunStore
from tests.containers import sandboxes

from .conftest import Stack


def branches(remote: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(remote), "for-each-ref", "--format=%(refname:short)", "refs/heads/"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def stopped(stack: Stack, run_id: str, stage: str) -> RunRecord:
    """The run once its stage has stopped (it is cancelled already)."""
    until(
        lambda: (
            api.get_run(run_id, settings=stack.settings).stages[stage].status
            == StageStatus.CANCELLED
        ),
        f"the {stage} stage did not stop",
    )
    return api.get_run(run_id, settings=stack.settings)


def test_a_cancel_while_the_pr_stage_waits_for_its_model_pushes_nothing(
    stack: Stack, run_store: RunStore
) -> None:
    # The pr stage's second model call (the one that answers with `publish`) takes 4 s; the
    # fake records a request when it answers, so the first one's record means the second is
    # about to be sent (after a `show_diff` in the sandbox).
    stack.fake.set_faults([{"agent": "pr", "requests": [2], "latency_ms": 4_000}])
    remote = stack.sample_repo()
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), remote)
    until(lambda: len(stack.requests("pr")) >= 1, "the pr stage never called its model")
    time.sleep(1.5)

    assert api.cancel(run_id, settings=stack.settings) is True
    cancelled_at = time.time()
    run = stopped(stack, run_id, "pr")

    assert run.status == RunStatus.CANCELLED
    assert branches(remote) == ["main"]
    assert run_store.output(run_id, "pr") is None
    pr = run.stages["pr"]
    assert pr.finished_at is not None and pr.finished_at >= cancelled_at
    assert pr.requests == 2  # what the stopped execution cost is kept
    until(lambda: sandboxes(run_id) == [], "the pr stage's sandbox was not removed", 15)
    done = [e for e in run_store.audit_log(run_id) if e["kind"] == "stage_done"]
    assert [e["branch"] for e in done] == [
        f"fixer.{s}" for s in ("triage", "search", "plan", "reproduce", "fix", "review")
    ]


def test_a_cancel_during_a_sub_second_plan_stage_records_no_output(
    stack: Stack, run_store: RunStore
) -> None:
    # Its one model call takes 700 ms: the cancel lands while it is in flight.
    stack.fake.set_faults([{"agent": "plan", "latency_ms": 700}])
    remote = stack.sample_repo()
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), remote)
    until(
        lambda: (
            api.get_run(run_id, settings=stack.settings).stages["plan"].status
            == StageStatus.RUNNING
        ),
        "the plan stage never started",
    )
    time.sleep(0.35)

    assert api.cancel(run_id, settings=stack.settings) is True
    run = stopped(stack, run_id, "plan")

    assert run.status == RunStatus.CANCELLED
    assert run_store.output(run_id, "plan") is None
    assert run.stages["plan"].requests == 1
    assert [run.stages[s].status for s in ("fix", "pr")] == [StageStatus.PENDING] * 2
    time.sleep(1.0)  # nothing is enqueued after the cancel: fix never starts
    assert stack.requests("fix") == []
    assert branches(remote) == ["main"]

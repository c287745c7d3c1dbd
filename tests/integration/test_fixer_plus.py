"""`fixer-plus` end to end on the demo's repository, through real Celery workers, Redis, dockerd
sandboxes and the fake Gemini: a middling fixability score gates the plan, search delegates one
child per suspected file, three fixes run at once (one wrong, two right, one of those with the
larger diff), the proof selects, and the one selected fix is published."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo import SENTRY_EVENT
from demo.plus import CHILD_MARK, SELECTED, SUSPECTED, branch_marker
from demo.plus import scenario as plus_scenario
from orchestrator.control import api
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.store import RunStore
from testkit import services
from testkit.services import worker_env

from .conftest import Stack, demo_scenario

pytestmark = pytest.mark.integration


@pytest.fixture
def plus(session_stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """The session's fake server with this scenario, and three workers of `fixer-plus`'s
    queues (one process each), beside the session's worker (which serves the fixer only)."""
    session_stack.fake.set_scenario(plus_scenario())
    session_stack.fake.reset()
    queues = [stage.queue for stage in load_pipeline("fixer-plus").stages]
    env = worker_env(session_stack.settings)
    with (
        services.worker(env, queues, logfile=tmp_path / "w1.log", name="plus-1"),
        services.worker(env, queues, logfile=tmp_path / "w2.log", name="plus-2"),
        services.worker(env, queues, logfile=tmp_path / "w3.log", name="plus-3"),
    ):
        yield session_stack
    session_stack.fake.set_scenario(demo_scenario())


def wait_for(stack: Stack, run_id: str, status: RunStatus, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while (run := api.get_run(run_id, settings=stack.settings)).status != status:
        assert not run.status.is_terminal, f"run ended {run.status}: {run.reason}"
        assert time.monotonic() < deadline, f"run still {run.status} after {timeout_s}s"
        time.sleep(0.2)


def test_fixer_plus_gates_delegates_fans_out_and_publishes_the_proven_smallest_fix(
    plus: Stack, run_store: RunStore
) -> None:
    repo = plus.sample_repo()
    run_id = plus.enqueue(SENTRY_EVENT.read_bytes(), repo, pipeline="fixer-plus")

    # A middling score: the plan waits for a person, and nothing of the code is touched.
    wait_for(plus, run_id, RunStatus.AWAITING_APPROVAL)
    parked = api.get_run(run_id, settings=plus.settings)
    assert list(parked.gates) == ["plan"]
    assert parked.stages["reproduce"].status == StageStatus.PENDING
    approval = api.approve(run_id, settings=plus.settings, by="reviewer")
    assert approval.applied and approval.queued == "reproduce"

    run = plus.wait(run_id, 240)
    assert run.status == RunStatus.DONE, run.reason

    # Best-of-3: the wrong fix's proof failed; of the two right ones, the smaller diff won.
    fan = run.stages["fix"].fan_in
    assert fan is not None
    assert {b: (r.status.value, r.proof_passed) for b, r in fan.branches.items()} == {
        "b1": ("failed", None), "b2": ("done", True), "b3": ("done", True),
    }  # fmt: skip
    assert (fan.branches["b1"].error or "").startswith("the change is not proven")
    assert fan.selected == SELECTED
    published = run_store.output(run_id, "pr")
    assert published is not None
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", f"{run.commit}..{published['commit']}", "--",
         "shopcart/cart.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "+        if count == 0:\n" in diff and "# an empty cart" not in diff
    assert "return -1" not in diff

    requests = plus.requests()
    # Three fix sessions at once: each branch's first request came before another's last.
    spans = {}
    for branch in ("b1", "b2", "b3"):
        mine = [e for e in requests if e["agent"] == "fix" and branch_marker(branch) in
                json.dumps(e["request"].get("systemInstruction", {}))]  # fmt: skip
        assert mine, f"no request of fix branch {branch}"
        spans[branch] = (min(e["ts"] for e in mine), max(e["replied"] for e in mine))
    assert (
        sum(
            1
            for a in spans
            for b in spans
            if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
        )
        >= 1
    ), f"no two fix branches overlapped: {spans}"

    # Search read its children's summaries, never their tool traffic.
    search = [e for e in requests if e["agent"] == "search"]
    last = json.dumps(search[-1]["request"])
    assert all(f"{CHILD_MARK} {path}" in last for path in SUSPECTED.values())
    child_reads = [e for e in requests if e["agent"].startswith("sub_")]
    assert len(child_reads) == 4
    assert '"read_file"' not in json.dumps(search[1]["request"]["contents"][-1])

"""Gates for real: a Celery worker subprocess, Redis and the fake Gemini server. A run parks
after its gated plan with nothing queued; a worker restart while it is parked changes nothing;
approved with an edited plan, the next stage's request (from the fake server's log) holds the
edit and not the proposal; another run is rejected with a reason and goes no further."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.models import GateStatus, RunRecord, RunStatus, StageStatus
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.settings import QueueConfig, Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

from .conftest import CANARY_KEY

GATED = """
name = "gated"

[[stages]]
name = "plan"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Plan a change for: {issue}"
gate = { approve = "plan" }

[[stages]]
name = "act"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Carry out this plan: {plan}"
"""
PROPOSED = "PROPOSED: rewrite the whole cart module"
EDITED = "EDITED: guard total() against an empty cart"
QUEUES = ["baton.gated.plan", "baton.gated.act"]


@dataclass
class Bench:
    settings: Settings
    store: RunStore
    fake: FakeGemini
    spec: Path
    repo: Path
    logs: Path

    def enqueue(self, text: str) -> str:
        return api.enqueue(text, repo=str(self.repo), pipeline=str(self.spec),
                           settings=self.settings, force=True)  # fmt: skip

    def worker(self, name: str) -> AbstractContextManager[Any]:
        return services.worker(worker_env(self.settings), QUEUES,
                               logfile=self.logs / f"{name}.log", name=name)  # fmt: skip

    def wait(self, run_id: str, status: RunStatus, timeout_s: float = 60.0) -> RunRecord:
        deadline = time.monotonic() + timeout_s
        while (run := self.store.get(run_id)).status != status:
            assert not run.status.is_terminal, f"run {run_id} ended {run.status}: {run.reason}"
            assert time.monotonic() < deadline, f"run {run_id} is still {run.status}"
            time.sleep(0.1)
        return run

    def requests(self, agent: str) -> list[str]:
        """What each request to `agent` said, as one string of JSON."""
        return [json.dumps(e["request"]) for e in self.fake.requests() if e["agent"] == agent]


@pytest.fixture(scope="module")
def bench(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    work = tmp_path_factory.mktemp("gates")
    url = redis_url.rsplit("/", 1)[0] + "/12"  # its own database: flushed at start
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    spec = work / "gated.toml"
    spec.write_text(GATED)
    played = {"agents": {"plan": [{"json": {"summary": PROPOSED}}],
                         "act": [{"json": {"summary": "done"}}]}}  # fmt: skip
    with FakeGemini.start(played) as fake:
        settings = Settings(redis_url=url, gemini_base_url=fake.url,
                            google_api_key=SecretStr(CANARY_KEY))  # fmt: skip
        yield Bench(settings, RunStore(client), fake, spec, make_sample_repo(work / "repo.git"),
                    work)  # fmt: skip
    client.close()


def parked_state(run: RunRecord) -> dict[str, Any]:
    """What must not change while a run is parked (its write time aside)."""
    return run.model_dump(mode="json", exclude={"updated_at"})


@pytest.mark.timeout(180)
def test_a_parked_run_survives_a_worker_restart_and_the_next_stage_reads_the_edited_plan(
    bench: Bench,
) -> None:
    with bench.worker("first"):
        run_id = bench.enqueue("Checkout crashes on an empty cart")
        parked = bench.wait(run_id, RunStatus.AWAITING_APPROVAL)
    assert parked.gates["plan"].status == GateStatus.PENDING
    assert parked.stages["act"].status == StageStatus.PENDING
    assert bench.store.redis.llen("baton.gated.act") == 0  # nothing queued, no slot held
    assert bench.store.output(run_id, "plan") == {"summary": PROPOSED}

    with bench.worker("second"):  # the worker restarted
        # A reconciler's sweep, even a day later, finds nothing stuck: nothing is sent again.
        with api.connect(bench.settings) as conductor:
            late = Reconciler(conductor, QueueConfig()).sweep(now=time.time() + 86_400)
        assert (late.repairs, late.gates, late.failed) == ([], {}, {})
        time.sleep(1)
        assert parked_state(bench.store.get(run_id)) == parked_state(parked)
        assert bench.requests("act") == []

        edit = bench.logs / "plan.json"
        edit.write_text(json.dumps({"summary": EDITED}))
        approval = api.approve(run_id, edit=edit, by="ana", settings=bench.settings)
        assert (approval.applied, approval.queued) == (True, "act")
        assert not api.approve(run_id, by="bob", settings=bench.settings).applied
        bench.wait(run_id, RunStatus.DONE)

    acts = bench.requests("act")
    assert len(acts) == 1  # the approval was applied once
    assert EDITED in acts[0] and PROPOSED not in acts[0]
    assert len(bench.requests("plan")) == 1  # nothing ran again


@pytest.mark.timeout(120)
def test_a_rejected_run_ends_with_the_reason_and_goes_no_further(bench: Bench) -> None:
    with bench.worker("third"):
        bench.fake.reset()
        run_id = bench.enqueue("Checkout crashes on a full cart")
        bench.wait(run_id, RunStatus.AWAITING_APPROVAL)

        assert api.reject(run_id, reason="rewrites too much", by="ana", settings=bench.settings)

    run = bench.store.get(run_id)
    assert (run.status, run.reason) == (
        RunStatus.REJECTED,
        "plan: rejected by ana: rewrites too much",
    )
    assert run.stages["act"].status == StageStatus.PENDING
    assert bench.requests("act") == []
    assert bench.store.redis.llen("baton.gated.act") == 0

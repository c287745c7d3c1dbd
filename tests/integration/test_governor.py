"""The fleet-wide quota governor for real: Celery worker processes sharing one Redis, the fake
Gemini server enforcing a quota or refusing half of all calls.

These tests start their own workers (with their own settings) on their own Redis database and
their own fake server, so the shared session worker, which has no quotas, never sees them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import DEFAULT_MODEL
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

from .conftest import Stack, stack_settings

MODEL = DEFAULT_MODEL
"""The model the workers use: the one the quota is set for."""
DATABASE = 9
"""This module's Redis database: flushed before each test, never used by the shared worker."""
PIPELINE = """
name = "governed"
description = "Two stages without tools: one model call each, two when a reply needs repair."

[[stages]]
name = "gov_first"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Summarize the report in one sentence.\\n{issue}"

[[stages]]
name = "gov_second"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Shorten this summary: {gov_first}"
"""
SUMMARY = {"json": {"summary": "Checkout divides cents twice."}}


@dataclass
class Fleet:
    """Workers of one pipeline on their own database, and how to run issues through them."""

    stack: Stack
    pipeline: Path
    repo: Path

    def run_all(self, count: int, timeout_s: float) -> list[RunRecord]:
        ids = [
            api.enqueue(
                f"Governed run {i}\nCheckout totals are off.",
                repo=str(self.repo),
                pipeline=str(self.pipeline),
                settings=self.stack.settings,
                force=True,
            )
            for i in range(count)
        ]
        return [self.stack.wait(run_id, timeout_s=timeout_s) for run_id in ids]


@pytest.fixture
def fleet_for(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    """Start a fake server playing a scenario and worker processes with extra environment."""
    with ExitStack() as stack:

        def start(
            scenario: dict[str, Any], *, workers: int, env: dict[str, str] | None = None
        ) -> Fleet:
            url = redis_url.rsplit("/", 1)[0] + f"/{DATABASE}"
            redis.Redis.from_url(url).flushdb()
            fake = stack.enter_context(FakeGemini.start(scenario))
            settings = stack_settings(url, fake, tmp_path)
            pipeline = tmp_path / "governed.toml"
            pipeline.write_text(PIPELINE)
            queues = [stage.queue for stage in load_pipeline(str(pipeline)).stages]
            for n in range(workers):
                stack.enter_context(
                    services.worker(
                        {**worker_env(settings), **(env or {})},
                        queues,
                        concurrency=2,
                        logfile=tmp_path / f"worker-{n}.log",
                        name=f"governed-{n}",
                    )
                )
            repo = make_sample_repo(tmp_path / "repo")
            return Fleet(Stack(settings, fake, tmp_path), pipeline, repo)

        yield start


def busiest_window(times: Sequence[float], window_s: float) -> int:
    """The most requests that arrived within any `window_s` (half-open) interval."""
    ordered = sorted(times)
    return max(
        sum(1 for t in ordered[i:] if t < start + window_s) for i, start in enumerate(ordered)
    )


@pytest.mark.timeout(180)
def test_two_workers_sharing_a_governor_keep_to_the_servers_quota_without_a_429(
    fleet_for: Any,
) -> None:
    quota = {"requests_per_minute": 60}
    fleet: Fleet = fleet_for(
        {"agents": {"*": [SUMMARY]}, "quota": {**quota, "window_s": 60}},
        workers=2,
        env={"BATON_QUOTAS": json.dumps({MODEL: quota})},
    )

    runs = fleet.run_all(35, timeout_s=150)

    served = fleet.stack.fake.requests()
    times = sorted(entry["ts"] for entry in served)
    assert [run.status for run in runs] == [RunStatus.DONE] * 35
    assert [entry["status"] for entry in served] == [200] * 70
    assert busiest_window(times, 60.0) == 60
    assert times[59] - times[0] < 30, "the first 60 calls should not have been held back"


@pytest.mark.timeout(180)
def test_in_a_429_storm_every_run_completes_and_no_call_lands_inside_a_cooldown(
    fleet_for: Any,
) -> None:
    repaired = [{"text": "Here is the summary you asked for."}, SUMMARY]
    scenario = {
        "agents": {"gov_first": [SUMMARY], "gov_second": repaired},
        "faults": [{"every": 2, "scope": "all", "status": 429, "retry_delay_s": 2}],
    }
    fleet: Fleet = fleet_for(scenario, workers=2)

    runs = fleet.run_all(4, timeout_s=150)

    entries = fleet.stack.fake.requests()
    refused = [e["ts"] for e in entries if e["status"] == 429]
    served = [e["ts"] for e in entries if e["status"] == 200]
    assert [run.status for run in runs] == [RunStatus.DONE] * 4, [r.reason for r in runs]
    # Three answered calls per run at least; more when a stage went back on its queue.
    assert len(served) >= 4 * 3
    assert len(refused) >= len(served) - 1
    # A call already on its way when the 429 was answered may still arrive: 0.3 s of grace.
    inside = [(t, e["ts"]) for t in refused for e in entries if t + 0.3 <= e["ts"] < t + 2.0]
    assert inside == []

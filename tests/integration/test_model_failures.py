"""How model-call failures play out over Celery: 429 → countdown retry, 5xx → backoff,
4xx → immediate failure, invalid output → one repair turn, budgets enforced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from demo import SENTRY_EVENT
from orchestrator.core.models import RunStatus, StageStatus

from .conftest import Stack, demo_scenario


def baton(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BATON_REDIS_URL": stack.settings.require_redis_url()}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def with_steps(agent: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    scenario = demo_scenario()
    scenario["agents"][agent] = {"steps": steps}
    return scenario


def test_a_429_retries_after_the_servers_delay_and_status_shows_the_wait(stack: Stack) -> None:
    stack.fake.set_faults([{"agent": "plan", "requests": [1], "status": 429, "retry_delay_s": 3}])
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo())

    waiting = None
    deadline = time.monotonic() + 60
    while waiting is None and time.monotonic() < deadline:
        shown = json.loads(baton(stack, "status", run_id, "--json").stdout)
        if shown["stages"]["plan"]["status"] == "waiting":
            waiting = shown
        time.sleep(0.2)
    table = baton(stack, "status", run_id).stdout
    run = stack.wait(run_id)

    assert waiting is not None, "baton status never showed the plan stage waiting"
    assert waiting["status"] == "waiting"
    assert waiting["stages"]["plan"]["waiting_until"] > time.time() - 60
    assert "plan waiting: next attempt at " in table
    assert run.status == RunStatus.DONE, run.reason
    refused, served = stack.requests("plan")[0], stack.requests("plan")[1]
    assert (refused["status"], served["status"]) == (429, 200)
    assert 3.0 <= served["ts"] - refused["ts"] <= 6.0
    plan = run.stages["plan"]
    assert (plan.attempts, plan.rate_limit_retries) == (2, 1)
    assert 3.0 <= plan.rate_limit_wait_s <= 4.0


def test_a_5xx_is_retried_with_backoff_inside_the_stage(stack: Stack) -> None:
    stack.fake.set_faults([{"agent": "triage", "requests": [1], "status": 503}])
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    assert [e["status"] for e in stack.requests("triage")] == [503, 200]
    assert run.stages["triage"].attempts == 1


def test_a_dropped_connection_is_retried_like_a_5xx(stack: Stack) -> None:
    stack.fake.set_faults([{"agent": "triage", "requests": [1], "drop": True}])
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    assert [e["status"] for e in stack.requests("triage")] == [0, 200]


def test_a_403_fails_the_stage_at_once_with_a_clear_message(stack: Stack) -> None:
    stack.fake.set_faults([{"agent": "triage", "status": 403}])
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.FAILED
    assert run.reason is not None and run.reason.startswith(
        "triage: the model API refused the request (403"
    )
    assert "GOOGLE_API_KEY" in run.reason
    assert len(stack.requests("triage")) == 1
    assert run.stages["search"].status == StageStatus.PENDING


def test_invalid_output_gets_one_repair_turn(stack: Stack) -> None:
    plan = demo_scenario()["agents"]["plan"]["steps"][0]
    stack.fake.set_scenario(with_steps("plan", [{"text": "Here is my plan: be careful."}, plan]))
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    repair = stack.requests("plan")[1]["request"]["contents"][-1]["parts"][0]["text"]
    assert repair.startswith("Your reply could not be used: the reply does not match Plan")
    assert run.stages["plan"].requests == 2


def test_output_still_invalid_after_the_repair_turn_fails_the_stage(stack: Stack) -> None:
    stack.fake.set_scenario(with_steps("plan", [{"json": {"approach": "x"}}]))
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.FAILED
    assert run.reason is not None
    assert run.reason.startswith("plan: stage 'plan' output is invalid after one repair turn")
    assert "steps: Field required" in run.reason
    assert len(stack.requests("plan")) == 2


def test_a_stage_that_never_stops_calling_tools_hits_its_model_call_cap(stack: Stack) -> None:
    stack.fake.set_scenario(with_steps("search", [{"call": {"name": "list_files", "args": {}}}]))
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.FAILED
    assert (
        run.reason
        == "search: stage 'search' reached its budget of 10 model calls without finishing"
    )
    assert len(stack.requests("search")) == 10


def test_not_actionable_triage_ends_the_run_skipped(stack: Stack) -> None:
    triage = dict(demo_scenario()["agents"]["triage"]["steps"][0]["json"])
    triage.update(actionable=False, reason="The error comes from a browser extension.")
    stack.fake.set_scenario(with_steps("triage", [{"json": triage}]))
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert (run.status, run.reason) == (
        RunStatus.SKIPPED,
        "triage: The error comes from a browser extension.",
    )
    assert stack.requests("search") == []

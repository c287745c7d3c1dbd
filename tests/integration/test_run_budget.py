"""A run's budget, end to end: a real worker, the fake Gemini through the real client, real
Redis and Docker. The run crosses its model-call budget in the middle of its code stage: the
stage stops at the call that would cross it, its sandbox is removed, the run fails with the
reason, and nothing is published."""

from __future__ import annotations

import subprocess

from demo import SENTRY_EVENT
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.spend import SpendLedger
from orchestrator.core.store import RunStore

from .conftest import Stack, demo_scenario

STAGES_BEFORE_FIX = ("triage", "search", "plan", "reproduce")


def sandboxes_of(run_id: str) -> list[str]:
    """Names of the containers (running or not) that are sandboxes of `run_id`."""
    listed = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name=baton-sbx-{run_id}.", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return listed.stdout.split()


def test_a_run_that_crosses_its_call_budget_mid_stage_fails_with_the_reason(
    stack: Stack, run_store: RunStore
) -> None:
    agents = demo_scenario()["agents"]
    before_fix = sum(len(agents[stage]["steps"]) for stage in STAGES_BEFORE_FIX)
    limit = before_fix + 2  # the fix stage's third model call would be one too many

    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo(), budget=f"calls={limit}")
    run = stack.wait(run_id)

    assert run.status == RunStatus.FAILED
    assert run.reason == (f"fix: run budget exceeded: model calls: {limit} made, limit {limit}"), (
        run.reason
    )
    assert run.stages["fix"].status == StageStatus.FAILED
    assert run.stages["pr"].status == StageStatus.PENDING  # nothing was published
    assert [r["agent"] for r in stack.requests()].count("fix") == 2
    assert not [r for r in stack.requests() if r["agent"] == "pr"]
    # The fix worked in a sandbox (its second request carries a tool's answer), now gone.
    assert "functionResponse" in str(stack.requests("fix")[1]["request"]["contents"])
    assert sandboxes_of(run_id) == []
    spend = SpendLedger(run_store.redis).spend(run_id)
    assert spend.calls == limit
    assert spend.exceeded == f"model calls: {limit} made, limit {limit}"
    assert spend.tokens > 0 and spend.uncosted == {"gemini-3.8-flash": limit}
    assert run.budget is not None and run.budget.calls == limit


def test_a_run_without_a_budget_spends_without_limits(stack: Stack, run_store: RunStore) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status == RunStatus.DONE, run.reason
    assert run.budget is None
    assert SpendLedger(run_store.redis).spend(run.id).calls == 0


def test_a_run_that_crosses_its_token_budget_stops_at_the_call_that_would_cross_it(
    stack: Stack, run_store: RunStore
) -> None:
    limit = 6_000
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo(), budget=f"tokens={limit}")
    run = stack.wait(run_id)

    assert run.status == RunStatus.FAILED
    assert run.reason is not None and ": run budget exceeded: tokens: " in run.reason, run.reason
    stopped = run.reason.split(":", 1)[0]
    assert run.stages[stopped].status == StageStatus.FAILED
    assert run.stages["pr"].status == StageStatus.PENDING
    assert sandboxes_of(run_id) == []
    spend = SpendLedger(run_store.redis).spend(run_id)
    sent = stack.requests()
    assert spend.calls == len(sent)  # every call counted was sent, and no other
    # Reconciled to what the server counted; only the replies can take it past the limit.
    assert spend.tokens == sum(
        e["prompt_tokens"] + e["candidates_tokens"] + e["thoughts_tokens"] for e in sent
    )
    assert spend.tokens - sent[-1]["candidates_tokens"] - sent[-1]["thoughts_tokens"] <= limit

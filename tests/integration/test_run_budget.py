"""A run's budget, end to end: a real worker, the fake Gemini through the real client, real
Redis and Docker. The run crosses its model-call budget in the middle of its code stage: the
stage stops at the call that would cross it, its sandbox is removed, the run fails with the
reason, and nothing is published."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import date

import pytest

from demo import SENTRY_EVENT
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import BudgetExceeded, SpendLedger
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


def until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


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
    assert spend.tokens > 0 and spend.uncosted == {}
    # gemini-3.8-flash's list price (orchestrator/core/prices.py cites it), per million tokens,
    # times what the fake server counted for the calls that were answered:
    rate_in, rate_out = (0.75, 3.75) if date.today() < date(2027, 1, 1) else (1.50, 7.50)
    answered = stack.requests()
    expected_usd = (
        sum(
            e["prompt_tokens"] * rate_in
            + (e["candidates_tokens"] + e["thoughts_tokens"]) * rate_out
            for e in answered
        )
        / 1_000_000
    )
    assert spend.cost_usd == pytest.approx(expected_usd, abs=1e-6)
    assert run.budget is not None and run.budget.calls == limit


def test_a_run_past_its_handoffs_stops_at_the_transition_and_no_later_stage_runs(
    stack: Stack, run_store: RunStore
) -> None:
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo(), budget="handoffs=2")
    run = stack.wait(run_id)

    # triage → search and search → plan are the two hand-offs; plan → reproduce is refused.
    assert run.status == RunStatus.FAILED
    assert run.reason == "plan: run budget exceeded: handoffs: 2 made, limit 2"
    assert run.stages["plan"].status == StageStatus.DONE
    assert run.stages["reproduce"].status == StageStatus.PENDING
    assert {r["agent"] for r in stack.requests()} == {"triage", "search", "plan"}
    spend = SpendLedger(run_store.redis).spend(run_id)
    assert (spend.handoffs, spend.exceeded) == (2, "handoffs: 2 made, limit 2")


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


def test_a_budget_another_execution_exhausts_stops_this_one_at_its_next_call(
    stack: Stack, run_store: RunStore
) -> None:
    """Two executions of one run at once (what a fan-out's branches are): while the fix stage
    waits for its second reply, another execution of the run (here the test, through the same
    ledger) spends the rest of the budget and is refused. The fix stage's next call is refused
    too: it stops, its sandbox is removed, the run fails with the reason, nothing is
    published."""
    stack.fake.set_faults([{"agent": "fix", "requests": [2], "latency_ms": 3_000}])
    limit = 100
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo(), budget=f"calls={limit}")
    # The fake records a request when it answers: once the first is recorded, the second is
    # sent after one tool call in the sandbox, and then takes 3 s.
    until(lambda: len(stack.requests("fix")) >= 1, "the fix stage never called its model")
    time.sleep(1.0)
    ledger = SpendLedger(run_store.redis)
    sibling = ledger.spend(run_id).calls
    with pytest.raises(BudgetExceeded):
        while True:  # the other execution spends until its budget refuses it
            ledger.reserve(run_id, RunBudget(calls=limit), tokens=10, cost_usd=None,
                           model="gemini-3.8-flash", started_at=time.time())  # fmt: skip
            sibling += 1
    assert sibling == limit

    run = stack.wait(run_id)

    assert run.status == RunStatus.FAILED
    assert run.reason == f"fix: run budget exceeded: model calls: {limit} made, limit {limit}"
    assert len(stack.requests("fix")) == 2  # the call in flight was answered; no third went out
    assert not stack.requests("pr")
    assert run.stages["pr"].status == StageStatus.PENDING
    assert sandboxes_of(run_id) == []

"""Several executions of one run spending from its budget at once, through the real
google-genai client against the fake Gemini server and a real Redis: each call reserved before
it is sent, reconciled from the reply's `usageMetadata`, and no call sent past a limit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from google.adk.models.llm_request import LlmRequest
from google.genai import types
from pydantic import SecretStr

from orchestrator.core.models import Issue, IssueSource, RunRecord
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import ModelConfig, RetryConfig
from orchestrator.core.spend import SpendLedger
from orchestrator.core.store import RunStore
from testkit.gemini import FakeGemini
from tests.test_architecture import ERROR_CLASSES
from workers.errors import ExecutionError, RunBudgetExceededError
from workers.gemini import build_model, close_model
from workers.spending import RunSpending, count_handoff, limit_of

MODEL = "gemini-2.5-flash"
INPUT_USD_PER_MTOK, OUTPUT_USD_PER_MTOK = 0.30, 2.50  # its list price, as the table says
EXECUTIONS = 4


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini.start({"agents": {"*": [{"text": "a reply of a few words " * 5}]}}) as server:
        yield server


def execution(fake: FakeGemini, url: str, budget: RunBudget, usage: list[tuple[int, int]]) -> str:
    """One execution of run r1: model calls one after the other until the budget refuses one;
    the refusal's message. Each reply's (prompt, output) tokens go to `usage`."""
    client = redis.Redis.from_url(url, decode_responses=True)
    model = build_model(
        ModelConfig(name=MODEL, base_url=fake.url, api_key=SecretStr("fake-key")), RetryConfig()
    )
    model.spending = RunSpending(SpendLedger(client), "r1", budget, started_at=time.time())

    async def run() -> str:
        try:
            while True:
                request = LlmRequest(
                    model=MODEL,
                    contents=[types.Content(role="user", parts=[types.Part(text="hi " * 40)])],
                )
                replies = [r async for r in model.generate_content_async(request)]
                meta = replies[-1].usage_metadata
                assert meta is not None
                output = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
                usage.append((meta.prompt_token_count or 0, output))  # thoughts bill as output
        except RunBudgetExceededError as exc:
            return str(exc)
        finally:
            await close_model(model)
            client.close()

    return asyncio.run(run())


def concurrently(fake: FakeGemini, url: str, budget: RunBudget) -> tuple[list[str], list]:
    usage: list[tuple[int, int]] = []
    refusals: list[str] = []
    threads = [
        threading.Thread(target=lambda: refusals.append(execution(fake, url, budget, usage)))
        for _ in range(EXECUTIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return refusals, usage


def test_concurrent_executions_send_exactly_the_calls_the_budget_allows(
    fake: FakeGemini, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    refusals, usage = concurrently(fake, unit_redis_url, RunBudget(calls=10))

    assert len(fake.requests()) == 10  # what reached the model API, whoever sent it
    assert len(refusals) == EXECUTIONS
    assert all(r == "run budget exceeded: model calls: 10 made, limit 10" for r in refusals)
    spend = SpendLedger(redis_client).spend("r1")
    assert spend.calls == 10
    assert spend.tokens == sum(prompt + output for prompt, output in usage)  # reconciled
    cost = sum(p * INPUT_USD_PER_MTOK + o * OUTPUT_USD_PER_MTOK for p, o in usage) / 1e6
    assert spend.cost_usd == pytest.approx(cost, rel=1e-6)


def test_concurrent_executions_overshoot_a_token_limit_by_replies_in_flight_at_most(
    fake: FakeGemini, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    """A call reserves its prompt's estimate; its reply is known only after. So the run may end
    past its token limit by at most the replies of the calls in flight, one per execution."""
    limit = 2_000
    refusals, usage = concurrently(fake, unit_redis_url, RunBudget(tokens=limit))

    assert all(r.startswith("run budget exceeded: tokens: ") for r in refusals)
    spend = SpendLedger(redis_client).spend("r1")
    assert spend.tokens == sum(prompt + output for prompt, output in usage)
    biggest_reply = max(output for _, output in usage)
    assert limit - max(p for p, _ in usage) - biggest_reply < spend.tokens
    assert spend.tokens <= limit + EXECUTIONS * biggest_reply
    assert len(fake.requests()) == spend.calls == len(usage)


def test_a_subagent_past_the_runs_handoffs_fails_the_stage_with_the_reason(
    store: RunStore,
) -> None:
    run = RunRecord(id="r2", pipeline="p", repo="/r", commit="c", idempotency_key="r2",
                    issue=Issue(source=IssueSource.TEXT, title="t"),
                    budget=RunBudget(handoffs=1))  # fmt: skip
    store.create(run, force=True)
    count_handoff(store, "r2")
    with pytest.raises(RunBudgetExceededError) as refused:
        count_handoff(store, "r2")
    assert str(refused.value) == "run budget exceeded: handoffs: 1 made, limit 1"
    assert limit_of("handoffs: 1 made, limit 1") == "handoffs"
    assert SpendLedger(store.redis).spend("r2").handoffs == 1


def test_only_a_budget_refusal_ends_the_whole_run_from_a_branch() -> None:
    """Of every execution error (found, not listed), the run's budget refusal alone is the
    run's: a branch failing with any other ends only itself."""
    execution_errors = [cls for cls in ERROR_CLASSES if issubclass(cls, ExecutionError)]
    assert len(execution_errors) > 10
    assert [cls for cls in execution_errors if cls.ends_run] == [RunBudgetExceededError]


def test_a_cost_limit_on_a_model_this_worker_has_no_price_for_refuses_the_call(
    unit_redis_url: str,
) -> None:
    """The enqueuer checked the run's models against its own prices; a worker that runs another
    model (its BATON_MODEL) or has other prices must not send calls it cannot cost."""
    client = redis.Redis.from_url(unit_redis_url, decode_responses=True)
    client.flushdb()
    spending = RunSpending(SpendLedger(client), "r1", RunBudget(cost_usd=1.0),
                           started_at=time.time())  # fmt: skip
    with pytest.raises(RunBudgetExceededError, match="no price for my-own-model"):
        spending.reserve("my-own-model", 100)
    assert SpendLedger(client).spend("r1").calls == 0, "nothing was sent"
    with pytest.raises(RunBudgetExceededError):  # the run is stopped for every execution
        RunSpending(SpendLedger(client), "r1", RunBudget(cost_usd=1.0),
                    started_at=time.time()).reserve(MODEL, 100)  # fmt: skip
    client.close()

"""The spend ledger on a real redis-server: reservations checked against every limit in one
atomic script, refusal shared by every execution of the run, and no overshoot under load."""

from __future__ import annotations

import threading

import pytest
import redis

from orchestrator.core import keys
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import BudgetExceeded, SpendLedger

T0 = 1_000_000.0


def reserve(ledger: SpendLedger, budget: RunBudget, tokens: int = 100, **kw: object) -> object:
    args: dict = {"cost_usd": None, "model": "m", "started_at": T0, "now": T0 + 1, **kw}
    return ledger.reserve("r1", budget, tokens=tokens, **args)


def test_calls_are_refused_past_the_limit_and_the_refusal_sticks(
    redis_client: redis.Redis,
) -> None:
    ledger = SpendLedger(redis_client)
    budget = RunBudget(calls=2)
    reserve(ledger, budget)
    reserve(ledger, budget)
    with pytest.raises(BudgetExceeded, match=r"^model calls: 2 made, limit 2$"):
        reserve(ledger, budget)
    # Another execution of the run, under a looser budget reading, is refused all the same.
    with pytest.raises(BudgetExceeded, match="model calls: 2 made"):
        reserve(ledger, RunBudget(calls=100))
    assert ledger.spend("r1").calls == 2
    assert ledger.spend("r1").exceeded == "model calls: 2 made, limit 2"


def test_tokens_are_reserved_then_reconciled_to_the_real_count(
    redis_client: redis.Redis,
) -> None:
    ledger = SpendLedger(redis_client)
    budget = RunBudget(tokens=1000)
    held = reserve(ledger, budget, tokens=300)
    assert ledger.spend("r1").tokens == 300
    ledger.reconcile("r1", held, tokens=650, cost_usd=None)  # type: ignore[arg-type]
    assert ledger.spend("r1").tokens == 650
    reserve(ledger, budget, tokens=350)  # 650 + 350 = 1000: exactly at the limit is allowed
    with pytest.raises(BudgetExceeded, match=r"^tokens: 1000 spent \+ 1 for the next call"):
        reserve(ledger, budget, tokens=1)


def test_cost_counts_only_priced_calls_and_says_which_were_not(
    redis_client: redis.Redis,
) -> None:
    ledger = SpendLedger(redis_client)
    budget = RunBudget(cost_usd=0.01)
    held = reserve(ledger, budget, cost_usd=0.004)
    ledger.reconcile("r1", held, tokens=100, cost_usd=0.006)  # type: ignore[arg-type]
    reserve(ledger, budget, cost_usd=None, model="gemini-unknown")
    spend = ledger.spend("r1")
    assert spend.cost_usd == pytest.approx(0.006)
    assert spend.uncosted == {"gemini-unknown": 1}
    with pytest.raises(BudgetExceeded, match=r"cost: \$0.0060 spent \+ \$0.0050 .* limit \$0.01"):
        reserve(ledger, budget, cost_usd=0.005)


def test_wall_time_and_iterations_are_checked_at_every_call(redis_client: redis.Redis) -> None:
    ledger = SpendLedger(redis_client)
    with pytest.raises(BudgetExceeded, match=r"^iterations: iteration 3, limit 2$"):
        reserve(ledger, RunBudget(iterations=2), iteration=3)
    redis_client.delete(keys.spend("r1"))
    reserve(ledger, RunBudget(wall_s=60), now=T0 + 59)
    with pytest.raises(BudgetExceeded, match=r"^wall time: 61s since the run began, limit 60"):
        reserve(ledger, RunBudget(wall_s=60), now=T0 + 61)


def test_stop_marks_the_run_once(redis_client: redis.Redis) -> None:
    ledger = SpendLedger(redis_client)
    assert ledger.stop("r1", "wall time: …")
    assert not ledger.stop("r1", "another")
    with pytest.raises(BudgetExceeded, match="wall time: …"):
        reserve(ledger, RunBudget())


@pytest.mark.parametrize(("limit", "size"), [("calls", 1), ("tokens", 7)])
def test_concurrent_executions_never_reserve_past_a_limit(
    unit_redis_url: str, redis_client: redis.Redis, limit: str, size: int
) -> None:
    """16 threads, each with its own connection (an execution of its own), reserve as fast as
    they can; what they reserve together stops at the limit, to the call."""
    budget = RunBudget(calls=50) if limit == "calls" else RunBudget(tokens=1000)
    granted: list[int] = []
    refused: list[str] = []
    start = threading.Barrier(16)

    def hammer() -> None:
        client = redis.Redis.from_url(unit_redis_url, decode_responses=True)
        ledger = SpendLedger(client)
        start.wait()
        try:
            for _ in range(40):
                try:
                    reserve(ledger, budget, tokens=size)
                    granted.append(size)
                except BudgetExceeded as exc:
                    refused.append(str(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    spend = SpendLedger(redis_client).spend("r1")
    if limit == "calls":
        assert len(granted) == spend.calls == 50  # 640 tried, exactly the limit granted
    else:
        assert sum(granted) == spend.tokens == 1000 // 7 * 7  # 142 calls of 7: 994 ≤ 1000
    assert len(refused) == 16 * 40 - len(granted)
    assert spend.exceeded is not None and spend.exceeded == refused[0]

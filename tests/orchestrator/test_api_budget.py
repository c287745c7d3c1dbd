"""A run's budget through the Python API and the CLI: a cost limit that could not be kept is
refused at enqueue (nothing written), and a run its budget stopped is resumed with a raised
budget, its spend carried over."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.control.cli import main
from orchestrator.core import keys
from orchestrator.core.errors import ConfigError, RunStateError
from orchestrator.core.models import RunStatus
from orchestrator.core.prices import ModelPrice
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import Settings
from orchestrator.core.spend import BudgetExceeded, SpendLedger
from tests.repos import Upstream


@pytest.fixture
def repo(make_upstream: Callable[[], Upstream]) -> str:
    made = make_upstream()
    made.commit({"cart.py": "def total(prices):\n    return sum(prices)\n"})
    return str(made.work)


def test_a_cost_limit_on_a_model_without_a_price_is_refused_at_enqueue_and_nothing_is_written(
    repo: str, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=unit_redis_url, model="gemini-9-flash")
    with pytest.raises(ConfigError) as refused:
        api.enqueue(SENTRY_EVENT.read_bytes(), repo=repo, settings=settings, budget="cost_usd=1")
    assert str(refused.value).startswith(
        "cost_usd=1: the cost of model 'gemini-9-flash' (stages triage, search, plan, reproduce, "
        "fix, review, pr) cannot be estimated"
    )
    assert redis_client.zcard(keys.RUNS) == 0
    priced = Settings(redis_url=unit_redis_url, model="gemini-9-flash",
                      prices={"gemini-9-flash": ModelPrice(input_usd_per_mtok=1,
                                                           output_usd_per_mtok=4)})  # fmt: skip
    run_id = api.enqueue(SENTRY_EVENT.read_bytes(), repo=repo, settings=priced, budget="cost_usd=1")
    assert api.get_run(run_id, settings=priced).budget == RunBudget(cost_usd=1)


def test_a_run_its_budget_stopped_is_resumed_from_the_cli_with_a_raised_budget(
    repo: str, unit_redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(redis_url=unit_redis_url)
    run_id = api.enqueue(SENTRY_EVENT.read_bytes(), repo=repo, settings=settings,
                         budget="calls=1,tokens=500")  # fmt: skip
    ledger = SpendLedger(redis_client)
    ledger.reserve(run_id, RunBudget(calls=1), tokens=100, cost_usd=None, model="m",
                   started_at=0, now=1)  # fmt: skip
    with pytest.raises(BudgetExceeded) as refused:
        ledger.reserve(run_id, RunBudget(calls=1), tokens=100, cost_usd=None, model="m",
                       started_at=0, now=1)  # fmt: skip
    with api.connect(settings) as conductor:
        conductor.fail(run_id, "triage", f"run budget exceeded: {refused.value}")

    with pytest.raises(RunStateError, match="resume it with a raised budget"):
        api.resume(run_id, settings=settings)
    monkeypatch.setenv("BATON_REDIS_URL", unit_redis_url)
    resumed = CliRunner().invoke(main, ["resume", run_id, "--budget", "calls=3"])

    assert (resumed.exit_code, resumed.output) == (0, f"run {run_id} resumed from triage\n")
    run = api.get_run(run_id, settings=settings)
    assert run.status == RunStatus.QUEUED and run.budget == RunBudget(calls=3, tokens=500)
    spend = ledger.spend(run_id)
    assert (spend.calls, spend.tokens, spend.exceeded) == (1, 100, None)

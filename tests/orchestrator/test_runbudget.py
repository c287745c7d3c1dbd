"""Run budgets: the `--budget` form, merging a run's override over its pipeline's, and prices."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.prices import ModelPrice, price_of
from orchestrator.core.runbudget import RunBudget, parse_budget
from orchestrator.core.spend import Spend


def test_a_budget_reads_every_limit() -> None:
    budget = parse_budget("tokens=200000, calls=40,wall_s=1800,iterations=3,cost_usd=2.5")
    assert budget == RunBudget(tokens=200_000, calls=40, wall_s=1800, iterations=3, cost_usd=2.5)
    assert budget.describe() == "tokens=200000,calls=40,wall_s=1800,iterations=3,cost_usd=2.5"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tokens", "'tokens' is not limit=number"),
        ("tokens=", "'tokens=' is not limit=number"),
        ("money=3", "unknown limit 'money'"),
        ("calls=3,calls=4", "'calls' is given twice"),
        ("calls=0", "calls: Input should be greater than 0"),
        ("tokens=lots", "tokens: Input should be a valid integer"),
        (" , ", "no limit given"),
    ],
)
def test_a_bad_budget_names_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="--budget: ") as caught:
        parse_budget(text)
    assert says in str(caught.value)


def test_a_run_override_replaces_only_the_limits_it_sets() -> None:
    pipeline = RunBudget(tokens=1000, calls=10, wall_s=60)
    assert pipeline.over(RunBudget(calls=3)) == RunBudget(tokens=1000, calls=3, wall_s=60)
    assert pipeline.over(None) == pipeline
    assert RunBudget().is_empty and RunBudget().describe() == "none"


def test_a_price_is_per_million_tokens_and_overrides_win() -> None:
    flash = price_of("gemini-2.5-flash")
    assert flash is not None
    # 0.30 $/M in, 2.50 $/M out: 2M in and 1M out cost 0.60 + 2.50.
    assert flash.cost_usd(2_000_000, 1_000_000) == pytest.approx(3.10)
    assert price_of("gemini-9-flash") is None
    mine = ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=2)
    assert price_of("gemini-9-flash", {"gemini-9-flash": mine}) is mine
    assert price_of("gemini-2.5-flash", {"gemini-2.5-flash": mine}) is mine


def test_spend_reads_from_its_hash_and_shows_beside_the_limits() -> None:
    spend = Spend.of(
        {"calls": "3", "tokens": "1200", "cost_usd": "0.0125", "uncosted:gemini-x": "2",
         "exceeded": "tokens: …"}
    )  # fmt: skip
    assert (spend.calls, spend.tokens, spend.cost_usd) == (3, 1200, 0.0125)
    assert spend.uncosted == {"gemini-x": 2}
    shown = spend.against(RunBudget(tokens=1000), elapsed_s=12.34)
    assert shown["tokens"] == {"spent": 1200, "limit": 1000}
    assert shown["calls"] == {"spent": 3, "limit": None}
    assert shown["wall_s"] == {"spent": 12.3, "limit": None}
    assert shown["cost_usd"]["not_estimated_for"] == {"gemini-x": 2}
    assert shown["exceeded"] == "tokens: …"


def test_baton_prices_sets_a_deployments_own_and_a_bad_one_names_its_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from orchestrator.core.settings import Settings

    monkeypatch.setenv(
        "BATON_PRICES",
        '{"gemini-3.8-flash": {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 3}}',
    )
    assert Settings().prices == {
        "gemini-3.8-flash": ModelPrice(input_usd_per_mtok=0.5, output_usd_per_mtok=3)
    }
    monkeypatch.setenv(
        "BATON_PRICES", '{"m": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 3}}'
    )
    with pytest.raises(ValidationError, match=r"prices\.m\.input_usd_per_mtok"):
        Settings()

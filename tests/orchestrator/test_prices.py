"""The price table: every figure cited, the long-prompt tier and a dated change modelled, the
table against LiteLLM's price list of the pinned version, and a cost limit refused at enqueue
when a stage's model has no price."""

from __future__ import annotations

import importlib.util
import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from orchestrator.control.cli import main
from orchestrator.core.errors import ConfigError
from orchestrator.core.pipeline import Pipeline, load_pipeline
from orchestrator.core.prices import PRICES, ModelPrice, price_of
from orchestrator.core.runbudget import RunBudget, check_priced
from tests.orchestrator.test_pipeline_check import GOOD


def litellm_prices() -> dict[str, Any]:
    """LiteLLM's own price list, as the pinned litellm ships it (read without importing it)."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations)))
    prices: dict[str, Any] = json.loads(
        (folder / "model_prices_and_context_window_backup.json").read_text()
    )
    return prices


def litellm_key(model: str) -> str:
    """The name LiteLLM's list gives a model Baton names `gemini-…`, `openai/…`, `anthropic/…`."""
    provider, _, name = model.rpartition("/")
    return f"gemini/{model}" if not provider else name


def test_every_price_names_its_page_and_date() -> None:
    for model, listed in PRICES.items():
        assert listed, model
        for entry in listed:
            assert "https://" in entry.source and entry.as_of[:4] == "2026", (model, entry)


def test_the_table_agrees_with_litellms_list_where_it_has_the_model() -> None:
    theirs_all = litellm_prices()
    missing = set()
    for model, listed in PRICES.items():
        theirs = theirs_all.get(litellm_key(model))
        if theirs is None:
            missing.add(model)
            continue
        price = listed[0].price
        ours = {
            "input_cost_per_token": price.input_usd_per_mtok,
            "output_cost_per_token": price.output_usd_per_mtok,
            "input_cost_per_token_above_200k_tokens": price.long_input_usd_per_mtok,
            "output_cost_per_token_above_200k_tokens": price.long_output_usd_per_mtok,
        }
        for field, figure in ours.items():
            per_mtok = None if theirs.get(field) is None else theirs[field] * 1_000_000
            assert figure == pytest.approx(per_mtok), (model, field)
    # Cited from the providers' pages only (LiteLLM 1.91.5 lists the Haiku only on Bedrock):
    assert missing == {
        "gemini-3.8-flash",
        "gemini-3.5-flash-lite",
        "anthropic/claude-3-5-haiku-20241022",
    }


def test_a_prompt_over_200k_tokens_bills_the_whole_call_at_the_long_rates() -> None:
    pro = price_of("gemini-2.5-pro")
    assert pro is not None
    # 1.25 $/M in and 10 $/M out up to 200k prompt tokens; 2.50 and 15 past them.
    assert pro.cost_usd(200_000, 1_000) == pytest.approx(0.25 + 0.01)
    assert pro.cost_usd(200_001, 1_000) == pytest.approx(200_001 * 2.5e-6 + 0.015)
    flash = price_of("gemini-2.5-flash")
    assert flash is not None and flash.cost_usd(300_000, 0) == pytest.approx(0.09)


def test_a_price_announced_to_change_changes_on_its_day() -> None:
    before = price_of("gemini-3.8-flash", on=date(2026, 12, 31))
    after = price_of("gemini-3.8-flash", on=date(2027, 1, 1))
    assert before == ModelPrice(input_usd_per_mtok=0.75, output_usd_per_mtok=3.75)
    assert after == ModelPrice(input_usd_per_mtok=1.50, output_usd_per_mtok=7.50)


def test_unknown_models_have_no_price_and_a_deployments_price_wins() -> None:
    assert price_of("gemini-2.0-flash") is None  # retired, no longer on a page cited
    mine = ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=2)
    assert price_of("gemini-2.0-flash", {"gemini-2.0-flash": mine}) is mine
    assert price_of("gemini-2.5-flash", {"gemini-2.5-flash": mine}) is mine


def test_a_long_rate_needs_the_other() -> None:
    with pytest.raises(ValidationError, match="long_input_usd_per_mtok and long_output"):
        ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=2, long_input_usd_per_mtok=3)


def fixer(model: str | None = None, summarizer: str | None = None) -> Pipeline:
    table = load_pipeline("fixer").table
    stages = [dict(stage) for stage in table["stages"]]
    if model:
        stages[-1]["model"] = model
    if summarizer:
        stages[1]["compaction"] = {"trigger_tokens": 5000, "model": summarizer}
    return Pipeline.model_validate({**table, "stages": stages})


def test_a_cost_limit_on_a_model_without_a_price_is_refused_naming_the_model_and_stages() -> None:
    budget = RunBudget(cost_usd=2)
    with pytest.raises(ConfigError) as refused:
        check_priced(budget, fixer("openai/gpt-9"), "gemini-2.5-flash")
    assert str(refused.value).startswith(
        "cost_usd=2: the cost of model 'openai/gpt-9' (stage pr) cannot be estimated"
    )
    assert "BATON_PRICES" in str(refused.value)
    with pytest.raises(ConfigError, match=r"model 'gemini-x' \(stages triage, search, plan, "):
        check_priced(budget, fixer(), "gemini-x")
    with pytest.raises(ConfigError, match=r"model 'gemini-y' \(stage search\)"):
        check_priced(budget, fixer(summarizer="gemini-y"), "gemini-2.5-flash")


def test_a_cost_limit_is_kept_when_every_model_has_a_price() -> None:
    check_priced(RunBudget(cost_usd=2), fixer(), "gemini-2.5-flash")
    mine = {"openai/gpt-9": ModelPrice(input_usd_per_mtok=1, output_usd_per_mtok=2)}
    check_priced(RunBudget(cost_usd=2), fixer("openai/gpt-9"), "gemini-2.5-flash", mine)
    check_priced(RunBudget(calls=3), fixer("openai/gpt-9"), "gemini-x")  # no cost limit
    check_priced(None, fixer(), "gemini-x")


def test_pipeline_check_refuses_a_run_budget_cost_limit_it_could_not_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "labeller.toml"
    path.write_text(
        GOOD.replace(
            'instruction = "Label {triage}"',
            'instruction = "Label {triage}"\nmodel = "openai/gpt-9"',
        )
        + "\n[run_budget]\ncost_usd = 1\n"
    )
    monkeypatch.setenv("BATON_MODEL", "gemini-2.5-flash")
    result = CliRunner().invoke(main, ["pipeline", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(
        f"error: {path}, field 'run_budget.cost_usd': cost_usd=1: the cost of model "
        "'openai/gpt-9' (stage label) cannot be estimated"
    )
    monkeypatch.setenv("BATON_PRICES", '{"openai/gpt-9": {"input_usd_per_mtok": 1, '
                       '"output_usd_per_mtok": 2}}')  # fmt: skip
    assert CliRunner().invoke(main, ["pipeline", "check", str(path)]).exit_code == 0

"""How a run's spend against its budget reads in `status`, `status --json` and `runs`."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from orchestrator.control.budget_view import budget_cell, budget_json, budget_line
from orchestrator.control.cli import main
from orchestrator.control.report import runs_table
from orchestrator.core.models import Issue, IssueSource, RunRecord, RunStatus
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import Spend
from tests.orchestrator.test_pipeline_check import GOOD
from tests.orchestrator.test_report import rendered


def run(budget: RunBudget | None, status: RunStatus = RunStatus.RUNNING) -> RunRecord:
    return RunRecord(
        id="r1", pipeline="fixer", repo="/r", commit="c", idempotency_key="k", status=status,
        issue=Issue(source=IssueSource.TEXT, title="t"), budget=budget, created_at=1000.0,
        updated_at=1030.0,
    )  # fmt: skip


STOPPED = Spend(calls=12, tokens=3402, exceeded="model calls: 12 made, limit 12")


def test_a_run_without_a_budget_shows_none() -> None:
    assert budget_json(run(None), STOPPED) is None
    assert budget_line(run(None), STOPPED) is None
    assert budget_cell(run(None), STOPPED) == ""


def test_the_line_shows_each_limit_set_beside_its_spend_and_why_it_stopped() -> None:
    line = budget_line(run(RunBudget(calls=12, tokens=50_000, wall_s=600)), STOPPED, now=1100.0)
    assert line == (
        "budget: calls 12/12 · tokens 3,402/50,000 · wall_s 100s/600s"
        " · stopped: model calls: 12 made, limit 12"
    )


def test_an_ended_run_counts_its_wall_time_to_its_end() -> None:
    shown = budget_json(run(RunBudget(wall_s=600), RunStatus.FAILED), Spend(), now=99_999.0)
    assert shown["wall_s"] == {"spent": 30.0, "limit": 600}


def test_the_line_shows_the_handoffs_made_beside_their_limit() -> None:
    spend = Spend(handoffs=4, exceeded="handoffs: 4 made, limit 4")
    line = budget_line(run(RunBudget(handoffs=4)), spend, now=1100.0)
    assert line == "budget: handoffs 4/4 · stopped: handoffs: 4 made, limit 4"
    assert budget_json(run(RunBudget(handoffs=4)), spend)["handoffs"] == {"spent": 4, "limit": 4}
    assert budget_cell(run(RunBudget(calls=9, handoffs=4)), spend) == "! 0/9 calls 4/4 hand-offs"


def test_a_cost_limit_says_which_models_it_could_not_price() -> None:
    spend = Spend(calls=3, cost_usd=0.0123, uncosted={"gemini-3.8-flash": 2})
    line = budget_line(run(RunBudget(cost_usd=1)), spend)
    assert line == (
        "budget: cost_usd $0.0123/$1.0000 · cost not estimated for gemini-3.8-flash (no price)"
    )


def test_runs_shows_a_budget_column_only_when_a_run_has_a_budget() -> None:
    budgeted = run(RunBudget(calls=12, cost_usd=2))
    assert budget_cell(budgeted, STOPPED) == "! 12/12 calls $0.00/$2.00"
    cells = {"r1": budget_cell(budgeted, STOPPED)}
    with_column = rendered(runs_table([budgeted], now=1100, width=160, budgets=cells), 160)
    assert "budget" in with_column and "! 12/12 calls $0.00/$2.00" in with_column
    assert "budget" not in rendered(runs_table([run(None)], now=1100, width=160), 160)


def test_enqueue_refuses_a_bad_budget_naming_the_limit() -> None:
    result = CliRunner().invoke(
        main, ["enqueue", "--text", "it crashes", "--repo", ".", "--budget", "calls=3,money=1"]
    )
    assert (result.exit_code, result.output) == (
        2,
        "error: --budget: unknown limit 'money' (limits: tokens, calls, wall_s, iterations, "
        "handoffs, cost_usd)\n",
    )


def test_a_pipeline_with_a_bad_run_budget_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "labeller.toml"
    path.write_text(GOOD + "\n[run_budget]\ncalls = 0\n")
    result = CliRunner().invoke(main, ["pipeline", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert "run_budget" in result.output and "greater than 0" in result.output
    path.write_text(GOOD + "\n[run_budget]\ncalls = 40\ncost_usd = 2.5\n")
    result = CliRunner().invoke(main, ["pipeline", "check", str(path)])
    assert result.exit_code == 0, result.output

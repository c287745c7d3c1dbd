"""A run's spend against its budget, as `status`, `status --json` and `runs` show it.

The spend is read from the ledger every execution of the run writes (`orchestrator.core.spend`);
a run without a budget shows none.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from orchestrator.core import keys
from orchestrator.core.models import RunRecord
from orchestrator.core.spend import Spend
from orchestrator.core.store import RunStore


def spend_of_each(store: RunStore, runs: Iterable[RunRecord]) -> dict[str, Spend]:
    """The spend of each run with a budget, read in one round trip."""
    budgeted = [run.id for run in runs if run.budget is not None]
    if not budgeted:
        return {}
    with store.redis.pipeline(transaction=False) as pipe:
        for run_id in budgeted:
            pipe.hgetall(keys.spend(run_id))
        found = pipe.execute()
    return {run_id: Spend.of(fields) for run_id, fields in zip(budgeted, found, strict=True)}


def budget_json(run: RunRecord, spend: Spend | None, now: float | None = None) -> Any:
    """`status --json`'s `budget`: each limit beside what was spent; None without a budget."""
    if run.budget is None:
        return None
    ended = run.updated_at if run.status.is_terminal else (time.time() if now is None else now)
    return (spend or Spend()).against(run.budget, elapsed_s=ended - run.created_at)


def budget_line(run: RunRecord, spend: Spend | None, now: float | None = None) -> str | None:
    """`calls 12/12 · tokens 3,402/50,000 · cost not estimated (gemini-x) · stopped: …`."""
    shown = budget_json(run, spend, now)
    if shown is None:
        return None
    parts = []
    for name, fmt in (("calls", "{:,}"), ("tokens", "{:,}"), ("cost_usd", "${:.4f}"),
                      ("wall_s", "{:.0f}s"), ("handoffs", "{:,}")):  # fmt: skip
        figure = shown[name]
        if figure["limit"] is not None:
            parts.append(f"{name} {fmt.format(figure['spent'])}/{fmt.format(figure['limit'])}")
    if shown["iterations"]["limit"] is not None:
        parts.append(f"iterations ≤ {shown['iterations']['limit']}")
    unpriced = shown["cost_usd"].get("not_estimated_for")
    if unpriced and run.budget is not None and run.budget.cost_usd is not None:
        parts.append(f"cost not estimated for {', '.join(sorted(unpriced))} (no price)")
    line = "budget: " + " · ".join(parts)
    if shown["exceeded"]:
        line += f" · stopped: {shown['exceeded']}"
    return line


def budget_cell(run: RunRecord, spend: Spend | None) -> str:
    """The `runs` table's short form: the limits set, each as spent/limit; `!` once stopped."""
    if run.budget is None:
        return ""
    spent = spend or Spend()
    cells = []
    if run.budget.calls is not None:
        cells.append(f"{spent.calls}/{run.budget.calls} calls")
    if run.budget.tokens is not None:
        cells.append(f"{spent.tokens:,}/{run.budget.tokens:,} tok")
    if run.budget.cost_usd is not None:
        cells.append(f"${spent.cost_usd:.2f}/${run.budget.cost_usd:.2f}")
    if run.budget.handoffs is not None:
        cells.append(f"{spent.handoffs}/{run.budget.handoffs} hand-offs")
    return ("! " if spent.exceeded else "") + (" ".join(cells) or run.budget.describe())

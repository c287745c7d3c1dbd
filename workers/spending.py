"""One execution's side of its run's budget: every model call reserved before it is sent and
reconciled after its reply, against the spend all the run's executions share
(`orchestrator.core.spend`).

`GovernedLlm` calls `reserve` before every attempt it sends, whichever provider serves it, so a
stage, a retry, a compaction summary or a host tool's model call all count; a refused call
raises `RunBudgetExceededError`, which fails the stage (and so the run) with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.core import handoffs
from orchestrator.core.prices import ModelPrice, price_of
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import STOPPED, BudgetExceeded, Reservation, SpendLedger
from orchestrator.core.store import RunStore
from workers import metrics
from workers.errors import RunBudgetExceededError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpending:
    """The budget of one run as one execution of it spends from it."""

    ledger: SpendLedger
    run_id: str
    budget: RunBudget
    started_at: float
    """When the run was created: its wall time counts from here."""
    iteration: int = 1
    prices: Mapping[str, ModelPrice] | None = None
    """The deployment's prices (`BATON_PRICES`), over the table's."""

    def reserve(self, model: str, prompt_tokens: int) -> Reservation:
        """Reserve one call of `model` with an estimated `prompt_tokens`.

        Raises:
            RunBudgetExceededError: the run's budget refuses it (the message says which limit).
        """
        price = price_of(model, self.prices)
        if price is None and self.budget.cost_usd is not None:
            # Checked at enqueue with the enqueuer's settings; a worker whose model or prices
            # differ must not spend a cost limit it cannot count.
            reason = (f"cost: the run has a cost limit, and this worker has no price for "
                      f"{model} (add it to BATON_PRICES)")  # fmt: skip
            self.ledger.stop(self.run_id, reason)
            raise refused(self.run_id, BudgetExceeded(reason))
        try:
            return self.ledger.reserve(
                self.run_id, self.budget, tokens=prompt_tokens,
                cost_usd=price.cost_usd(prompt_tokens, 0) if price else None, model=model,
                started_at=self.started_at, iteration=self.iteration,
            )  # fmt: skip
        except BudgetExceeded as exc:
            raise refused(self.run_id, exc) from exc

    def reconcile(
        self,
        model: str,
        reservation: Reservation,
        prompt_tokens: int,
        output_tokens: int,
        *,
        sent: bool = True,
    ) -> None:
        """Replace the reservation's estimate by what the call used (nothing, if it failed;
        not even the call, if it was never sent)."""
        price = price_of(model, self.prices)
        if price is not None:
            metrics.budget_cost(model, price.cost_usd(prompt_tokens, output_tokens))
        self.ledger.reconcile(
            self.run_id, reservation, tokens=prompt_tokens + output_tokens,
            cost_usd=price.cost_usd(prompt_tokens, output_tokens) if price else None, sent=sent,
        )  # fmt: skip


def count_handoff(store: RunStore, run_id: str) -> None:
    """Count a subagent about to start as one of the run's hand-offs (a run with a budget).

    Raises:
        RunBudgetExceededError: the run's budget refuses it (the message says which limit).
    """
    try:
        handoffs.delegated(store, run_id)
    except BudgetExceeded as exc:
        raise refused(run_id, exc) from exc


def refused(run_id: str, exc: BudgetExceeded) -> RunBudgetExceededError:
    """A refusal of the run's budget as the error that fails the stage, logged and counted."""
    logger.warning("run %s stopped by its budget: %s", run_id, exc)
    metrics.budget_stop(limit_of(str(exc)))
    return RunBudgetExceededError(f"{STOPPED}{exc}")


LIMIT_WORDS = {"model calls": "calls", "tokens": "tokens", "cost": "cost", "wall time": "wall",
               "iterations": "iterations", "handoffs": "handoffs"}  # fmt: skip
"""The first words of a refusal (`orchestrator.core.spend`) → the `limit` label of the metric."""


def limit_of(reason: str) -> str:
    """Which limit a refusal names, as the metric labels it."""
    return LIMIT_WORDS.get(reason.split(":", 1)[0], "other")

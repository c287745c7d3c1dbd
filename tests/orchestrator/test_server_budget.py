"""`baton serve` shows a run's spend against its budget (the run page draws `budget_line`)."""

from __future__ import annotations

import time

from orchestrator.core.models import Issue, IssueSource
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.spend import SpendLedger

from .test_server import Served, served  # noqa: F401  (the fixture)


def test_a_run_shows_its_spend_beside_its_budget(served: Served) -> None:  # noqa: F811
    issue = Issue(source=IssueSource.TEXT, title="Login times out")
    run_id, _ = served.conductor.submit(
        issue, repo="/srv/git/auth", commit="b" * 40, pipeline="fixer", budget=RunBudget(calls=3)
    )
    ledger = SpendLedger(served.store.redis)
    for _ in range(2):
        ledger.reserve(run_id, RunBudget(calls=3), tokens=100, cost_usd=None, model="m",
                       started_at=time.time())  # fmt: skip

    view = served.get(f"/api/v1/runs/{run_id}").json()

    assert view["budget"]["calls"] == {"spent": 2, "limit": 3}
    assert view["budget"]["tokens"] == {"spent": 200, "limit": None}
    assert view["budget_line"] == "budget: calls 2/3"
    unbudgeted = served.get(f"/api/v1/runs/{served.run_id}").json()
    assert (unbudgeted["budget"], unbudgeted["budget_line"]) == (None, None)

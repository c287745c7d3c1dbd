from __future__ import annotations

import json

from orchestrator.models import Issue, IssueSource, Iteration, RunRecord, StageRecord, StageStatus
from orchestrator.report import Activity, live_activity, run_json, run_table

SESSION = "r1:search:2"


def entry(
    kind: str, *, usage: int | None = None, tool: str | None = None, session: str = SESSION
) -> dict[str, str]:
    content = (
        {"parts": [{"function_call": {"name": tool, "args": {}}}]}
        if tool
        else {"parts": [{"text": "x"}]}
    )
    data = {"content": content, "usage": {"prompt_token_count": usage} if usage else None}
    return {"session": session, "kind": kind, "data": json.dumps(data)}


def run_with_search_running() -> RunRecord:
    stages = {
        "triage": StageRecord(status=StageStatus.DONE, requests=1, prompt_tokens_total=500),
        "search": StageRecord(
            status=StageStatus.RUNNING, attempts=2, session_id=SESSION, started_at=1.0
        ),
    }
    issue = Issue(source=IssueSource.TEXT, title="t")
    return RunRecord(
        id="r1", pipeline="fixer", repo="/r", commit="c", issue=issue, idempotency_key="k",
        stages=stages,
    )  # fmt: skip


def test_a_running_stage_shows_its_calls_tokens_and_current_tool() -> None:
    tail = [
        entry("stage_begin", session="r1:search:1"),
        entry("tool_call", usage=999, tool="list_files", session="r1:search:1"),
        entry("user_message"),
        entry("tool_call", usage=400, tool="search_code"),
        entry("tool_result"),
        entry("tool_call", usage=900, tool="read_file"),
    ]
    assert live_activity(run_with_search_running(), tail) == {
        "search": Activity(model_calls=2, prompt_tokens=1300, doing="calling read_file")
    }


def test_the_table_shows_the_live_figures_of_a_running_stage() -> None:
    run = run_with_search_running()
    table = run_table(run, now=5.0, activity={"search": Activity(2, 1300, "calling read_file")})
    cells = {column.header: list(column.cells) for column in table.columns}
    assert cells["calls"] == ["1", "2"]
    assert cells["prompt tok"] == ["500", "1,300"]
    assert cells["note"] == ["", "calling read_file"]
    assert cells["time"] == ["", "4.0s…"]


def test_a_looped_stage_shows_its_iteration_and_why_the_last_one_failed() -> None:
    run = run_with_search_running()
    failed = Iteration(number=1, attempt=1, passed=False, reason="1 reproducing test still fails")
    run.stages["fix"] = StageRecord(
        status=StageStatus.RUNNING, attempts=2, iteration=2, iterations=[failed], started_at=2.0
    )

    cells = {c.header: list(c.cells) for c in run_table(run, now=5.0).columns}
    shown = run_json(run)["stages"]["fix"]

    assert cells["stage"] == ["triage", "search", "fix.2"]  # as its task id: <run>.fix.2
    assert cells["note"][2] == "iteration 1: 1 reproducing test still fails"
    assert (shown["iteration"], [i["passed"] for i in shown["iterations"]]) == (2, [False])

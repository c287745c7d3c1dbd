from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console, RenderableType
from rich.table import Table

from orchestrator.control.report import (
    Activity,
    live_activity,
    outcome,
    published,
    published_line,
    run_json,
    run_table,
    run_view,
    runs_table,
)
from orchestrator.core.models import (
    Issue,
    IssueSource,
    Iteration,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.specs import load_pipeline
from tests.twin import Names

SESSION = "r1:search:2"
RUN_ID = "20261130-225200-4f1c2a"
"""A run id as Baton makes them: `YYYYMMDD-HHMMSS-xxxxxx`, 22 characters."""


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


def cells_of(table: Table) -> dict[str, list[str]]:
    """Each column's cells as text, by header."""
    return {str(column.header): [str(cell) for cell in column.cells] for column in table.columns}


def rendered(renderable: RenderableType, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


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
    cells = cells_of(table)
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

    cells = cells_of(run_table(run, now=5.0))
    shown = run_json(run)["stages"]["fix"]

    assert cells["stage"] == ["triage", "search", "fix.2"]  # as its task id: <run>.fix.2
    assert cells["note"][2] == "iteration 1: 1 reproducing test still fails"
    assert (shown["iteration"], [i["passed"] for i in shown["iterations"]]) == (2, [False])


def a_run(number: int = 0, **fields: Any) -> RunRecord:
    """A run (of the fixer pipeline unless told) with a long issue title, created at 0."""
    issue = Issue(
        source=IssueSource.SENTRY_EVENT,
        title="ZeroDivisionError: division by zero in checkout_summary of an empty cart",
    )
    fields = {"created_at": 0.0, "updated_at": 60.0, "pipeline": "fixer", **fields}
    return RunRecord(
        id=f"{RUN_ID[:-1]}{number}", repo="/srv/git/shop", commit="c",
        issue=issue, idempotency_key=f"k{number}", **fields,
    )  # fmt: skip


LONG_ERROR = "\n".join(
    f"FAIL: test_{n} (tests.test_cart.CartTest.test_{n}) AssertionError: 0 != 1" for n in range(23)
)
"""A failed stage's error as a test log makes it: 23 lines."""


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_runs_table_shows_every_run_id_whole_on_one_line_at_any_width(width: int) -> None:
    runs = [
        a_run(0, status=RunStatus.RUNNING, current_stage="reproduce"),
        a_run(1, status=RunStatus.FAILED, reason=f"fix: {LONG_ERROR}"),
        a_run(2, status=RunStatus.CANCELLED, reason="cancelled"),
    ]

    text = rendered(runs_table(runs, now=3_600.0, width=width), width)

    lines = text.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines)
    for run in runs:
        assert len([line for line in lines if run.id in line]) == 1
    # title, three border lines, the header, one line per run
    assert len(lines) == 1 + 3 + 1 + len(runs)


@pytest.mark.parametrize(
    ("width", "headers"),
    [
        (60, ["run", "status", "age", "issue"]),
        (80, ["run", "status", "pipeline", "age", "issue", "reason"]),
        (120, ["run", "status", "pipeline", "stage", "age", "issue", "reason"]),
    ],
)
def test_a_narrow_runs_table_leaves_out_the_least_needed_columns(
    width: int, headers: list[str]
) -> None:
    table = runs_table(
        [a_run(status=RunStatus.FAILED, reason="fix: 1 test still fails")], width=width
    )

    assert list(cells_of(table)) == headers


def test_at_80_columns_the_runs_table_keeps_each_runs_pipeline_whole() -> None:
    """The widest a run's row gets at 80 columns: a cancelled run, a stage named, a long issue
    title and reason, pipelines of eight characters: the issue and the reason give way."""
    runs = [
        a_run(n, pipeline=name, status=RunStatus.CANCELLED, current_stage="reproduce",
              reason=f"fix: {LONG_ERROR}")
        for n, name in enumerate(["fixer", "reviewer", "labeller"])
    ]  # fmt: skip

    lines = rendered(runs_table(runs, now=3_600.0, width=80), 80).splitlines()

    assert lines[2].split("┃")[3].strip() == "pipeline"
    for run in runs:
        row = next(line for line in lines if run.id in line)
        assert run.pipeline in row.split("│")[3] and len(row.rstrip()) <= 80
        assert "│ ZeroDivi" in row and "… │" in row  # the issue shrank, ending in an ellipsis


@pytest.mark.parametrize(("count", "title"), [(0, "0 runs"), (1, "1 run"), (2, "2 runs")])
def test_the_runs_table_counts_its_runs_in_good_english(count: int, title: str) -> None:
    table = runs_table([a_run(n) for n in range(count)], now=0.0)

    assert rendered(table, 80).splitlines()[0].strip() == title


def test_at_80_columns_a_run_drops_its_size_figures_and_keeps_the_note_on_one_line() -> None:
    run = a_run(status=RunStatus.RUNNING, environment="e3b0c44298fc1c149afbf4c8996fb924")
    run.stages = {
        "triage": StageRecord(status=StageStatus.DONE, attempts=1, requests=2,
                              prompt_tokens_total=1_234, started_at=1.0, finished_at=3.5),
        "search": StageRecord(status=StageStatus.RUNNING, attempts=1, started_at=10.0,
                              session_id=f"{run.id}:search:1"),
        "plan": StageRecord(),
    }  # fmt: skip
    doing = "calling search_code, read_file"
    table = run_table(run, now=40.0, activity={"search": Activity(3, 4_567, doing)}, width=80)

    text = rendered(table, 80)
    lines = text.splitlines()

    assert f"run {run.id} · fixer · running" in lines[0]
    assert list(cells_of(table)) == [
        "stage", "status", "tries", "calls", "prompt tok", "time", "note"
    ]  # fmt: skip
    assert len(lines) == 1 + 3 + 1 + len(run.stages) + 1  # one line per stage, no note wraps
    assert lines[-1].strip() == f"environment {run.environment}"
    search = next(line for line in lines if "search" in line)
    assert "4,567" in search and "30.0s…" in search
    assert "calling search_" in search and search.rstrip().endswith("… │")  # cut, not wrapped
    assert all(len(line.rstrip()) <= 80 for line in lines)


def test_a_failed_stages_error_is_cut_and_put_below_the_table() -> None:
    run = a_run(status=RunStatus.FAILED, reason=f"fix: {LONG_ERROR}")
    run.stages = {
        "triage": StageRecord(status=StageStatus.DONE, attempts=1),
        "fix": StageRecord(status=StageStatus.FAILED, attempts=1, error=LONG_ERROR),
    }

    table = run_table(run, now=100.0, width=80)
    text = rendered(table, 80)
    below = text.split("└")[-1]

    assert cells_of(table)["note"] == ["", "error below"]
    assert below.count("FAIL: test_") == 3  # the first three lines of the 23
    assert "FAIL: test_3 " not in text
    assert "more characters; --json shows them all]" in below
    assert below.count("fix failed:") == 1 and "fix: FAIL" not in below  # the reason says it
    assert len(text.splitlines()) <= 14


def test_an_error_or_a_publication_quoting_hostile_bytes_reaches_the_terminal_escaped() -> None:
    hostile = "boom\x1b]0;owned\x07\x1b[2J\x9b31m"
    run = a_run(status=RunStatus.FAILED, reason=f"fix: {hostile}")
    run.stages = {"fix": StageRecord(status=StageStatus.FAILED, attempts=1, error=hostile)}
    where = {"stage": "pr", "url": f"https://example.com/{hostile}", "branch": None}

    text = rendered(run_table(run, now=100.0, width=80, where=where), 120)

    assert not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)
    assert text.count("boom\\x1b]0;owned") == 2  # the error below the table, and the page


@pytest.mark.parametrize(
    ("run_status", "stage_status", "status_shown", "note"),
    [
        (RunStatus.CANCELLED, StageStatus.RUNNING, "cancelled", "stopping"),
        (RunStatus.CANCELLED, StageStatus.CANCELLED, "cancelled", ""),
        (RunStatus.FAILED, StageStatus.QUEUED, "stopped", ""),
        (RunStatus.RUNNING, StageStatus.RUNNING, "running", "calling read_file"),
    ],
)
def test_a_stage_its_run_ended_under_shows_the_runs_end(
    run_status: RunStatus, stage_status: StageStatus, status_shown: str, note: str
) -> None:
    run = run_with_search_running()
    run.status = run_status
    run.stages["search"].status = stage_status
    activity = live_activity(run, [entry("tool_call", usage=10, tool="read_file")])

    cells = cells_of(run_table(run, now=5.0, activity=activity))

    assert (cells["status"][1], cells["note"][1]) == (status_shown, note)


class RecordedStore:
    """A run store that has one run and its audit entries, as `RunStore` reads them."""

    def __init__(self, run: RunRecord, audit: list[dict[str, str]]) -> None:
        self.run, self.audit = run, audit

    def get(self, run_id: str) -> RunRecord:
        assert run_id == self.run.id
        return self.run

    def audit_tail(self, run_id: str, count: int = 200) -> list[dict[str, str]]:
        return self.audit[-count:]

    def outputs(self, run_id: str, names: list[str]) -> dict[str, Any]:
        return {}  # no stage has finished


def test_status_shows_the_live_figures_of_a_running_stage_as_watch_does() -> None:
    run = run_with_search_running()
    audit = [entry("tool_call", usage=400, tool="search_code"), entry("tool_result")]

    shown, table = run_view(RecordedStore(run, audit), run.id, width=80)  # type: ignore[arg-type]

    assert shown is run
    assert (cells_of(table)["calls"][1], cells_of(table)["note"][1]) == ("1", "thinking")


@pytest.mark.parametrize(
    ("status", "ended_at"),
    [(RunStatus.RUNNING, None), (RunStatus.DONE, 60.0), (RunStatus.CANCELLED, 60.0)],
)
def test_a_runs_json_has_when_it_was_created_changed_and_ended(
    status: RunStatus, ended_at: float | None
) -> None:
    found = run_json(a_run(status=status, created_at=2.5, updated_at=60.0))

    assert (found["created_at"], found["updated_at"], found["ended_at"]) == (2.5, 60.0, ended_at)
    assert {"run_id", "status", "reason", "issue", "stages"} <= set(found)


FIX_OUTPUT = {
    "summary": "average_price_cents returns 0 for an empty cart",
    "tests_before": {"command": "python -m unittest", "exit_code": 1, "passed": 2, "failed": 3},
    "tests_after": {"command": "python -m unittest", "exit_code": 0, "passed": 5, "failed": 0},
    "proof": {"passed": True, "reason": "proven", "reproducing_command": "x",
              "fail_to_pass": ["t.T.test_empty"], "pass_to_fail": [], "diff_stat": "1 file"},
}  # fmt: skip


PR_OUTPUT = {"branch": "baton/r", "commit": "0123456789abcdef", "title": "t", "body": "b",
             "pull_request_url": "https://github.com/o/r/pull/7"}  # fmt: skip


def test_the_outcome_is_what_baton_measured_and_published_by_stage(names: Names) -> None:
    """Found at the fields the pipeline's schemas mark `Measured`, under their names: the same
    figures for the fixer and its twin, whose every field is named otherwise."""
    pipeline = load_pipeline(names.pipeline)
    run = a_run(status=RunStatus.DONE)
    run.stages = {
        names.stages[n]: StageRecord(status=StageStatus.DONE) for n in ("plan", "fix", "pr")
    }
    outputs = {
        names.stages["plan"]: names.output("plan", {"steps": ["x"]}),
        names.stages["fix"]: names.output("fix", FIX_OUTPUT),
        names.stages["pr"]: names.output("pr", PR_OUTPUT),
    }
    fix, pr = names.stages["fix"], names.stages["pr"]

    found = outcome(run, outputs, pipeline)
    stages = run_json(run, outputs, pipeline)["stages"]

    assert {stage: names.output_back(name, found[stage]) for name, stage in
            (("fix", fix), ("pr", pr))} == {
        fix: {
            "tests_before": {"exit_code": 1, "passed": 2, "failed": 3},
            "tests_after": {"exit_code": 0, "passed": 5, "failed": 0},
            "proof": {"passed": True, "reason": "proven",
                      "fail_to_pass": ["t.T.test_empty"], "pass_to_fail": []},
        },
        pr: {"branch": "baton/r", "pull_request_url": "https://github.com/o/r/pull/7"},
    }  # fmt: skip
    assert names.stages["plan"] not in found
    assert stages[pr][names.fields["branch"]] == "baton/r"
    assert names.fields["branch"] not in run_json(run)["stages"][pr]


def test_where_a_run_published_is_read_from_the_facts_its_schemas_declare(names: Names) -> None:
    pipeline = load_pipeline(names.pipeline)
    run = a_run(status=RunStatus.DONE)
    run.stages = {names.stages[n]: StageRecord(status=StageStatus.DONE) for n in ("fix", "pr")}
    outputs = {names.stages["pr"]: names.output("pr", PR_OUTPUT)}

    where = run_json(run, outputs, pipeline)["published"]
    table = rendered(run_table(run, now=0.0, width=100, where=where), 100)

    assert where == {"stage": names.stages["pr"], "url": "https://github.com/o/r/pull/7",
                     "branch": "baton/r", "commit": "0123456789abcdef"}  # fmt: skip
    assert (
        f"published ({names.stages['pr']}): https://github.com/o/r/pull/7 · branch baton/r · "
        "commit 0123456789ab"
    ) in table


def test_a_run_that_published_nothing_says_so_with_null() -> None:
    pipeline = load_pipeline("fixer")
    run = a_run(status=RunStatus.DONE)
    run.stages = {"fix": StageRecord(status=StageStatus.DONE)}
    outputs = {"fix": FIX_OUTPUT}

    assert run_json(run, outputs, pipeline)["published"] is None
    assert "published" not in rendered(run_table(run, now=0.0, width=100), 100)
    assert outcome(run, outputs, None) == {}  # a pipeline this process cannot read: no figures


def test_a_publication_without_a_page_names_its_branch() -> None:
    pipeline = load_pipeline("fixer")
    run = a_run(status=RunStatus.DONE)
    run.stages = {"pr": StageRecord(status=StageStatus.DONE)}
    outputs = {"pr": {**PR_OUTPUT, "pull_request_url": None}}

    where = published(run, outputs, pipeline)

    assert where == {"stage": "pr", "url": None, "branch": "baton/r", "commit": "0123456789abcdef"}
    assert published_line(where) is not None
    assert str(published_line(where)) == "published (pr): branch baton/r · commit 0123456789ab"

"""How a fan-out stage's branches are shown — `status` (table and `--json`), `watch`'s live
figures, `log --by-branch`, the web UI's time line — from hand-built run records."""

from __future__ import annotations

import json

import pytest

from orchestrator.control.branch_view import RUN_LEVEL, group_by_branch
from orchestrator.control.inspection import Entry, read_entry
from orchestrator.control.report import live_activity, run_json, run_table
from orchestrator.control.timeline import timeline
from orchestrator.core.fanin import BranchRecord, BranchStatus, FanIn
from orchestrator.core.models import (
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)

from .test_cli_inspect import HOSTILE, _no_control, rendered
from .test_report import cells_of

RUN = "20261202-071800-a1b2c3"


def fan(*, joined: bool = False, selected: str | None = None) -> FanIn:
    """b1 done with its proof passed, b2 running its second execution, b3 failed."""
    return FanIn(
        branches={
            "b1": BranchRecord(
                status=BranchStatus.DONE, attempts=1, session_id=f"{RUN}:fix:b1:1",
                started_at=10.0, finished_at=40.0, proof_passed=True, requests=4,
                prompt_tokens_total=1200, output_chars=300,
            ),
            "b2": BranchRecord(
                status=BranchStatus.RUNNING, attempts=2, interrupted=1,
                session_id=f"{RUN}:fix:b2:2", started_at=20.0,
            ),
            "b3": BranchRecord(
                status=BranchStatus.FAILED, attempts=1, session_id=f"{RUN}:fix:b3:1",
                started_at=10.0, finished_at=30.0, error=f"model said {HOSTILE}",
            ),
        },
        ended=2, joined=joined, selected=selected,
    )  # fmt: skip


def a_run(fan_in: FanIn, status: RunStatus = RunStatus.RUNNING) -> RunRecord:
    stages = {
        "plan": StageRecord(status=StageStatus.DONE, attempts=1, started_at=1.0, finished_at=9.0),
        "fix": StageRecord(
            status=StageStatus.RUNNING, attempts=1, started_at=10.0, queued_at=9.5, fan_in=fan_in
        ),
        "pr": StageRecord(),
    }
    return RunRecord(
        id=RUN, pipeline="fixer-plus", repo="/r", commit="c", status=status,
        issue=Issue(source=IssueSource.TEXT, title="t"), idempotency_key="k", stages=stages,
        created_at=0.0, updated_at=50.0,
    )  # fmt: skip


def test_status_shows_a_row_per_branch_under_its_stage_with_attempts_and_session() -> None:
    cells = cells_of(run_table(a_run(fan()), now=50.0))

    assert cells["stage"] == ["plan", "fix", "  ├ b1", "  ├ b2", "  └ b3", "pr"]
    assert cells["status"][2:5] == ["done", "running", "failed"]
    assert cells["tries"][2:5] == ["1", "2", "1"]
    assert cells["time"][2:5] == ["30.0s", "30.0s…", "20.0s"]
    assert cells["note"][1] == "2/3 branches ended (1 failed)"
    assert cells["note"][2] == "…:fix:b1:1 · proof passed"  # the run id is in the title
    assert cells["note"][3] == "…:fix:b2:2 · lost 1x"
    assert cells["note"][4].startswith("model said ok")


def test_the_selected_branch_is_marked_and_the_stage_says_which_was_selected() -> None:
    joined = fan(joined=True, selected="b1")
    joined.branches["b2"].status, joined.branches["b2"].finished_at = BranchStatus.DONE, 45.0
    joined.ended = 3

    cells = cells_of(run_table(a_run(joined), now=50.0))

    assert cells["stage"][2:5] == ["  ├ b1 ★", "  ├ b2", "  └ b3"]
    assert cells["note"][1] == "b1 selected of 3"


def test_a_branch_left_running_by_a_cancelled_run_shows_stopped() -> None:
    cells = cells_of(run_table(a_run(fan(), RunStatus.CANCELLED), now=50.0))
    assert cells["status"][2:5] == ["done", "stopped", "failed"]


@pytest.mark.parametrize("status", list(BranchStatus))
def test_every_branch_status_is_shown_in_status_and_watch(status: BranchStatus) -> None:
    shown = fan()
    shown.branches["b2"].status = status
    cells = cells_of(run_table(a_run(shown), now=50.0))
    assert cells["status"][3] == status.value


def test_a_hostile_branch_error_reaches_the_terminal_escaped() -> None:
    shown = rendered(run_table(a_run(fan()), now=50.0, width=400), 400)
    assert _no_control(shown)
    assert "\\x1b]0;owned" in shown


def test_status_json_carries_every_branch_with_its_session_and_the_selection() -> None:
    shown = run_json(a_run(fan(joined=True, selected="b1")))["stages"]

    branches = shown["fix"]["fan_in"]["branches"]
    assert list(branches) == ["b1", "b2", "b3"]
    assert [b["selected"] for b in branches.values()] == [True, False, False]
    assert branches["b2"]["session_id"] == f"{RUN}:fix:b2:2"
    assert (branches["b2"]["status"], branches["b2"]["attempts"]) == ("running", 2)
    assert shown["fix"]["fan_in"]["selected"] == "b1"
    assert shown["plan"]["fan_in"] is None


def test_watch_counts_a_running_branch_s_model_calls_from_its_own_session() -> None:
    usage = json.dumps({"usage": {"prompt_token_count": 700}, "content": {"parts": []}})
    tail = [
        {"session": f"{RUN}:fix:b2:2", "kind": "model_reply", "data": usage},
        {"session": f"{RUN}:fix:b2:2", "kind": "model_reply", "data": usage},
        {"session": f"{RUN}:fix:b2:1", "kind": "model_reply", "data": usage},  # lost attempt
        {"session": f"{RUN}:fix:b3:1", "kind": "model_reply", "data": usage},  # ended branch
    ]
    run = a_run(fan())

    activity = live_activity(run, tail)
    cells = cells_of(run_table(run, now=50.0, activity=activity))

    assert set(activity) == {"fix.b2"}
    assert (activity["fix.b2"].model_calls, activity["fix.b2"].prompt_tokens) == (2, 1400)
    assert cells["calls"][2:5] == ["4", "2", "0"]
    assert cells["prompt tok"][3] == "1,400"
    assert cells["note"][3] == "…:fix:b2:2 · lost 1x · replying"


def test_a_branch_s_audit_entry_belongs_to_its_stage_and_attempt() -> None:
    raw = {"id": "1-0", "ts": "1.0", "branch": "fixer-plus.fix.b2", "kind": "stage_begin",
           "session": f"{RUN}:fix:b2:3", "data": "{}"}  # fmt: skip
    entry = read_entry(raw)
    assert (entry.stage, entry.attempt, entry.branch) == ("fix", 3, "fixer-plus.fix.b2")
    plain = read_entry({**raw, "session": f"{RUN}:search:2", "branch": "fixer-plus.search"})
    assert (plain.stage, plain.attempt) == ("search", 2)


def an_entry(number: int, branch: str) -> Entry:
    return Entry(id=f"{number}-0", ts=float(number), branch=branch, stage=None, attempt=None,
                 kind="model_reply")  # fmt: skip


def test_log_by_branch_groups_interleaved_entries_by_label_in_order_of_first_entry() -> None:
    labels = ["fixer-plus.plan", "fixer-plus.fix.b2", "fixer-plus.fix.b1", "fixer-plus.fix.b2",
              "", "fixer-plus.fix.b1"]  # fmt: skip
    entries = [an_entry(n, label) for n, label in enumerate(labels)]

    groups = group_by_branch(entries)

    assert list(groups) == ["fixer-plus.plan", "fixer-plus.fix.b2", "fixer-plus.fix.b1", RUN_LEVEL]
    assert [e.id for e in groups["fixer-plus.fix.b1"]] == ["2-0", "5-0"]
    assert [e.id for e in groups["fixer-plus.fix.b2"]] == ["1-0", "3-0"]


def test_the_time_line_has_a_lane_per_started_branch_with_the_selected_one_marked() -> None:
    spans = [s for s in timeline(a_run(fan(selected="b1")), []) if s.branch is not None]

    by_branch = {s.branch: s for s in spans}
    assert set(by_branch) == {"b1", "b2", "b3"}
    assert (by_branch["b1"].state, by_branch["b1"].selected) == ("done", True)
    assert (by_branch["b2"].state, by_branch["b2"].end) == ("running", None)
    assert by_branch["b3"].state == "failed" and by_branch["b3"].note.startswith("model said")
    assert {s.label for s in spans} == {"fix.b1", "fix.b2", "fix.b3"}
    assert not any(s.selected for s in spans if s.branch != "b1")


def test_a_branch_still_running_when_the_run_ended_ends_cancelled_on_the_time_line() -> None:
    spans = timeline(a_run(fan(), RunStatus.CANCELLED), [])
    b2 = next(s for s in spans if s.branch == "b2")
    assert (b2.state, b2.end) == ("cancelled", 50.0)


def test_a_queued_branch_has_no_lane_yet() -> None:
    queued = fan()
    queued.branches["b4"] = BranchRecord()
    assert "b4" not in {s.branch for s in timeline(a_run(queued), [])}

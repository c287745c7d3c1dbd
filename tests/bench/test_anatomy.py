"""The run-anatomy benchmark's arithmetic and its docs section, without services: a run record and
audit log written by hand, and a results file written by hand."""

from __future__ import annotations

import json

from bench import anatomy, claims, docs
from orchestrator.core.models import (
    Issue,
    IssueSource,
    Iteration,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)

PHASES_ZERO = {
    "environment_s": 0.0, "sandbox_start_s": 0.0, "copy_in_s": 0.0, "build_s": 0.0,
    "commands_s": 0.0, "changes_s": 0.0, "tools_s": 0.0, "model_s": 0.0, "sandbox_stop_s": 0.0,
}  # fmt: skip


def columns(**seconds: float) -> dict[str, float]:
    """A stage's (or a run's) columns: `seconds` where given, else none."""
    return {"queue_wait_s": 0.0, **PHASES_ZERO, "rest_s": 0.0, **seconds}


def timings_entry(stage: str, **spent: float) -> dict[str, str]:
    """A `timings` audit entry as the run store reads it back: every field a string."""
    return {"kind": "timings", "stage": stage, "data": json.dumps({"iteration": 1, **spent})}


def test_a_runs_wall_time_is_split_into_queue_waits_phases_baton_and_the_gaps() -> None:
    run = RunRecord(id="r1", pipeline="fixer", repo="/r", commit="c", idempotency_key="k",
                    issue=Issue(source=IssueSource.TEXT, title="t"), status=RunStatus.DONE,
                    created_at=1000.0)  # fmt: skip
    run.stages["search"] = StageRecord(status=StageStatus.DONE, queued_at=1000.5,
                                       started_at=1001.0, finished_at=1005.0)  # fmt: skip
    run.stages["fix"] = StageRecord(  # looped: a failed iteration, then one that passed
        status=StageStatus.DONE, queued_at=1010.5, started_at=1011.0, finished_at=1013.0,
        iterations=[
            Iteration(number=1, attempt=1, passed=False, started_at=1006.0, finished_at=1010.0),
            Iteration(number=2, attempt=2, passed=True, started_at=1011.0, finished_at=1013.0),
        ],
    )  # fmt: skip
    audit = [
        {"kind": "model_reply", "stage": "search", "data": "{}"},
        timings_entry("search", sandbox_start_s=0.5, commands_s=1.0, model_s=0.5),
        timings_entry("fix", commands_s=2.0),
        timings_entry("fix", commands_s=1.0, copy_in_s=0.5),
    ]

    found = anatomy.anatomy(run, audit, ["triage", "search", "fix"])

    assert found["stages"] == [  # triage never ran: no row
        {"stage": "search", "queue_wait_s": 0.5, **PHASES_ZERO, "sandbox_start_s": 0.5,
         "commands_s": 1.0, "model_s": 0.5, "rest_s": 2.0},
        {"stage": "fix", "queue_wait_s": 0.5, **PHASES_ZERO, "commands_s": 3.0, "copy_in_s": 0.5,
         "rest_s": 2.5},  # 4 s and 2 s of iterations, 3.5 s of them timed
    ]  # fmt: skip
    assert found["wall_s"] == 13.0
    # 0.5 s before search was queued, 1 s between search and fix, 0.5 s between iterations
    assert found["between_s"] == 2.0
    assert found["totals"]["commands_s"] == 4.0
    assert found["shares"]["commands_s"] == round(4.0 / 13.0, 4)
    assert found["shares"]["between_s"] == round(2.0 / 13.0, 4)


RESULTS = {
    "benchmark": "anatomy",
    "date": "2026-12-02 11:30",
    "commit": "abc1234",
    "took_s": 61,
    "latency_ms": 0,
    "warm_runs": 2,
    "passes": [
        {
            "runtime": "runsc",
            "warm_walls_s": [9.5, 10.25],
            "runs": [
                {
                    "label": "demo, first run",
                    "case": "demo",
                    "run_id": "r-x",
                    "caller_wall_s": 10.4,
                    "wall_s": 10.0,
                    "between_s": 0.5,
                    "stages": [
                        {
                            "stage": "fix",
                            **columns(
                                queue_wait_s=0.25,
                                copy_in_s=2.0,
                                commands_s=1.5,
                                model_s=0.75,
                                rest_s=5.0,
                            ),
                        },
                    ],
                    "totals": columns(
                        queue_wait_s=0.25, copy_in_s=2.0, commands_s=1.5, model_s=0.75, rest_s=5.0
                    ),
                    "shares": {
                        **columns(
                            queue_wait_s=0.025,
                            copy_in_s=0.2,
                            commands_s=0.15,
                            model_s=0.075,
                            rest_s=0.5,
                        ),
                        "between_s": 0.05,
                    },
                }
            ],
        }
    ],
}


def test_the_section_shows_each_run_as_a_table_of_seconds_and_shares() -> None:
    source = docs.Source("bench/results/anatomy.json", RESULTS)

    text = anatomy.latest(source)

    assert text.startswith(
        "Latest run (`bench/results/anatomy.json`, commit abc1234, 2026-12-02 11:30; it took "
        "61 s; fake model at latency 0 ms):"
    )
    assert "**Sandboxes under runsc (gVisor)** (warm runs' walls: 9.50, 10.25 s)" in text
    assert (
        "**demo, first run** (run r-x): 10.00 s from the run's creation to its last stage's "
        "end; 10.40 s from the enqueue call to the end as the caller saw it"
    ) in text
    lines = text.splitlines()
    assert (
        "| stage | queue wait | environment | sandbox start | copy-in | build | test runs | "
        "patches and diffs | code tools | model calls | sandbox removal | Baton's own | "
        "stage total |"
    ) in lines
    assert (
        "| fix | 0.25 | 0.00 | 0.00 | 2.00 | 0.00 | 1.50 | 0.00 | 0.00 | 0.75 | 0.00 | 5.00 "
        "| 9.50 |"
    ) in lines
    assert "| between stages |  |  |  |  |  |  |  |  |  |  |  | 0.50 |" in lines
    assert (
        "| **all** | 0.25 | 0.00 | 0.00 | 2.00 | 0.00 | 1.50 | 0.00 | 0.00 | 0.75 | 0.00 | 5.00 "
        "| 10.00 |"
    ) in lines
    assert (
        "| **share of the run** | 2.5% | 0.0% | 0.0% | 20.0% | 0.0% | 15.0% | 0.0% | 0.0% | 7.5% "
        "| 0.0% | 50.0% | between stages 5.0% |"
    ) in lines


def test_every_figure_of_the_section_is_traced_to_the_results_file() -> None:
    source = docs.Source("bench/results/anatomy.json", RESULTS)

    text = anatomy.latest(source)

    assert claims.untraced(text, [source]) == []
    assert claims.untraced(text.replace("9.50 |", "9.40 |"), [source]) == ["9.40"]


def test_the_target_sets_baton_and_sandbox_start_and_copy_in_against_the_test_runs() -> None:
    source = docs.Source("bench/results/anatomy.json", RESULTS)

    lines = anatomy.latest(source).splitlines()

    # own 5.0 + sandbox start 0 + copy-in 2.0 = 7.0 against test runs 1.5
    assert "| runsc | demo, first run | 7.00 | 1.50 | no |" in lines

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestrator.control.fleet import Fleet, QueueView, WorkerView, fleet_view

TASKS = ["20261130-225200-4f1c2a.fix.2", "20261130-225207-9b0e11.search",
         "20261130-225209-77aa01.fix.b10"]  # fmt: skip
"""What a worker runs, by task id: `<run id>.<stage>`, `.<iteration>` from the second on,
`.<branch>` for a branch of a fan-out stage."""


def rendered(fleet: Fleet, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(fleet_view(fleet, width=width))
    return console.export_text()


@pytest.mark.parametrize("width", [60, 80, 120])
def test_top_shows_every_task_id_whole_beside_a_long_worker_name(width: int) -> None:
    fleet = Fleet(
        queues=[QueueView("baton.fixer.fix", waiting=3, delivered=1)],
        workers=[
            WorkerView("celery@baton-fix-7d9c8b6f5-x2x4q.workers.baton.svc.cluster.local", TASKS),
            WorkerView("celery@laptop", []),
        ],
        runs={"done": 12, "running": 2},
    )

    lines = [line.rstrip() for line in rendered(fleet, width).splitlines()]

    for task in TASKS:
        assert len([line for line in lines if task in line]) == 1
    assert "2 workers" in lines
    assert any("idle" in line for line in lines)
    assert all(len(line) <= width for line in lines)


def test_an_idle_fleet_says_so_in_words_and_counts_one_worker_in_the_singular() -> None:
    idle = Fleet(queues=[], workers=[WorkerView("celery@laptop", [])], runs={})

    lines = [line.strip() for line in rendered(idle, 80).splitlines()]

    assert lines[0] == "queues: no stage queue has work"
    assert "1 worker" in lines
    assert lines[-1] == "runs: none among the newest 200"


def test_a_fleet_without_workers_says_none_answered() -> None:
    text = rendered(Fleet(queues=[], workers=[], runs={"done": 1}), 80)

    assert "workers: none answered" in text


def test_top_says_which_waiting_queues_no_worker_serves() -> None:
    fleet = Fleet(
        queues=[
            QueueView("baton.fixer.fix", waiting=2, delivered=0, servers=1),
            QueueView("baton.labeller.triage", waiting=1, delivered=0, servers=0),
            QueueView("baton.labeller.label", waiting=0, delivered=1, servers=0),
        ],
        workers=[WorkerView("celery@laptop", [])],
    )

    text = rendered(fleet, 100)

    assert "no worker serves baton.labeller.triage" in text
    assert "baton.fixer.fix" in text and "serves baton.fixer.fix" not in text
    assert "serves baton.labeller.label" not in text  # nothing waits there
    assert Fleet.as_json(fleet)["queues"]["baton.labeller.triage"]["servers"] == 0

"""The sending side: what a stage's message and its task-sent event say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import STAGE_TASK, Dispatcher, celery_app
from orchestrator.core.settings import QueueConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stage", ["triage", "fix"])
def test_a_stage_is_sent_as_the_one_stage_task_but_named_for_its_stage_everywhere(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = celery_app("test-sender", "memory://", QueueConfig(), set_as_current=False)
    sent: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(
        app.amqp,
        "send_task_message",
        lambda producer, name, message, **options: sent.append((message, options)),
    )
    spec = next(s for s in load_pipeline("fixer").stages if s.name == stage)

    task_id = Dispatcher(app).send_stage("20261129-000000-abcdef", "fixer", spec)

    [(message, options)] = sent
    assert task_id == f"20261129-000000-abcdef.{stage}"
    assert message.headers["task"] == STAGE_TASK == "baton.run_stage"  # what the worker runs
    assert message.headers["shadow"] == f"baton.fixer.{stage}"  # what the worker's events say
    assert message.sent_event["name"] == f"baton.fixer.{stage}"  # and the sender's, for Flower
    assert message.sent_event["uuid"] == task_id
    assert options["queue"].name == spec.queue == f"baton.fixer.{stage}"


def test_a_pool_process_collects_less_and_leaves_what_it_inherited_alone() -> None:
    probe = (
        "import gc; from orchestrator.core.queue import YOUNG_COLLECTION_EVERY, collect_less\n"
        "before = gc.get_threshold(); collect_less()\n"
        "print(before[0], gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *before[1:]),"
        " gc.get_freeze_count() > 1000)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=ROOT)  # fmt: skip
    assert done.stdout.split() == ["700", "True", "True"]

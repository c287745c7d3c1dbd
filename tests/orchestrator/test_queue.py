"""The sending side: what a stage's message and its task-sent event say."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.pipeline import load_pipeline
from orchestrator.queue import STAGE_TASK, Dispatcher, celery_app
from orchestrator.settings import QueueConfig


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

    task_id = Dispatcher(app).send_stage("20261129-000000-abcdef", spec)

    [(message, options)] = sent
    assert task_id == f"20261129-000000-abcdef.{stage}"
    assert message.headers["task"] == STAGE_TASK == "baton.run_stage"  # what the worker runs
    assert message.headers["shadow"] == f"baton.{stage}"  # what the worker's events say
    assert message.sent_event["name"] == f"baton.{stage}"  # and the sender's, for Flower
    assert message.sent_event["uuid"] == task_id
    assert options["queue"].name == spec.queue == f"baton.{stage}"

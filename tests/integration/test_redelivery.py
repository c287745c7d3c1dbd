"""A stage delivered again after its output was recorded only advances the run."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from demo import SENTRY_EVENT
from orchestrator.core.models import StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.store import RunStore
from testkit import services
from testkit.services import worker_env

from .conftest import Stack, stack_settings


def test_a_redelivered_stage_only_advances_and_enqueues_nothing_twice(
    redis_url: str, stack: Stack, tmp_path: Path
) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/5"
    settings = stack_settings(url, stack.fake, tmp_path)
    mine = Stack(settings, stack.fake, tmp_path)
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    store = RunStore(client)

    triage = load_pipeline("fixer").stage("triage")
    with services.worker(worker_env(settings), [triage.queue], logfile=tmp_path / "worker.log"):
        run_id = mine.enqueue(SENTRY_EVENT.read_bytes(), mine.sample_repo())
        deadline = time.monotonic() + 60
        while store.get(run_id).stages["triage"].status != StageStatus.DONE:
            assert time.monotonic() < deadline, "triage did not finish"
            time.sleep(0.1)
        output = store.output(run_id, "triage")

        dispatcher = Dispatcher.connect(url, settings.queue)
        dispatcher.send_stage(run_id, "fixer", load_pipeline("fixer").stage("triage"))
        dispatcher.close()
        deadline = time.monotonic() + 30
        while not any('"action": "advance"' in e["data"] for e in store.audit_log(run_id)):
            assert time.monotonic() < deadline, "the redelivered stage never ran"
            time.sleep(0.1)

    run = store.get(run_id)
    assert run.stages["triage"].attempts == 1
    assert store.output(run_id, "triage") == output
    assert run.stages["search"].status == StageStatus.QUEUED
    assert client.llen("baton.fixer.search") == 1
    assert len(stack.requests("triage")) == 1
    client.flushdb()
    client.close()

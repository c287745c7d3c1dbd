"""A run pins its pipeline: its name and the digest of its spec in the record, the spec beside
it; every transition, the reconciler and `resume` read that version, whatever the file says
by then. Against a real Redis, with messages on the real queues."""

from __future__ import annotations

import hashlib
import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.core import keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import PipelineError
from orchestrator.core.models import Issue, IssueSource, RunStatus, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler, Repair
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

from .test_conductor import TRIAGE_OK, begin, queued_task_ids, result

ISSUE = Issue(source=IssueSource.TEXT, title="Label me", body="the cart is empty")
QUEUE = QueueConfig(stuck_after_s=60, reconcile_every_s=30)
SPEC = """
name = "labeller"

[[stages]]
name = "triage"
output_schema = "orchestrator.pipelines.fixer.schemas:Triage"
instruction = "Version one. Triage {issue}"

[[stages]]
name = "label"
output_schema = "orchestrator.pipelines.fixer.schemas:Triage"
instruction = "Label {triage}"
"""


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QUEUE)
    yield Conductor(store, dispatcher)
    dispatcher.close()


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "labeller.toml"
    path.write_text(SPEC)
    return path


def digest_of(text: str) -> str:
    """The documented digest: SHA-256 of the spec's table as JSON, keys sorted, no spaces."""
    table = tomllib.loads(text)
    canonical = json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_a_run_records_the_pipelines_name_and_digest_not_the_path_typed(
    conductor: Conductor, spec_file: Path, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(spec_file))

    run = conductor.store.get(run_id)
    assert (run.pipeline, run.pipeline_hash) == ("labeller", digest_of(SPEC))
    pinned = json.loads(redis_client.get(keys.pipeline(run_id)) or "")
    assert pinned == tomllib.loads(SPEC)
    assert queued_task_ids(redis_client, "baton.labeller.triage") == [f"{run_id}.triage"]
    assert redis_client.llen("baton.fixer.triage") == 0
    [raw] = redis_client.lrange("baton.labeller.triage", 0, -1)
    assert json.loads(raw)["headers"]["shadow"] == "baton.labeller.triage"


def test_an_edited_spec_does_not_change_a_run_in_flight(
    conductor: Conductor, spec_file: Path, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(spec_file))
    spec_file.write_text(SPEC.replace("Version one.", "Version two.").replace('"label"', '"tag"'))

    begin(conductor, run_id, "triage")
    conductor.complete(run_id, "triage", result(TRIAGE_OK))

    run = conductor.store.get(run_id)
    assert run.current_stage == "label"  # the pinned version's next stage, not the file's `tag`
    assert queued_task_ids(redis_client, "baton.labeller.label") == [f"{run_id}.label"]
    assert "Version one." in conductor.pipeline_of(run).first.instruction
    assert load_pipeline(str(spec_file)).stages[1].name == "tag"  # what the file says now


def test_resume_keeps_the_pinned_version_unless_given_the_latest(
    conductor: Conductor, spec_file: Path, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(spec_file))
    begin(conductor, run_id, "triage")
    conductor.fail(run_id, "triage", "boom")
    edited = SPEC.replace("Version one.", "Version two.")
    spec_file.write_text(edited)

    conductor.resume(run_id)
    assert conductor.store.get(run_id).pipeline_hash == digest_of(SPEC)

    conductor.cancel(run_id)
    conductor.resume(run_id, pipeline=load_pipeline(str(spec_file)))
    run = conductor.store.get(run_id)
    assert run.pipeline_hash == digest_of(edited)
    assert "Version two." in conductor.pipeline_of(run).first.instruction
    assert json.loads(redis_client.get(keys.pipeline(run_id)) or "") == tomllib.loads(edited)
    assert [e["kind"] for e in conductor.store.audit_log(run_id)][-1] == "run_resumed"


def test_resume_refuses_another_pipeline(conductor: Conductor, spec_file: Path) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(spec_file))
    conductor.cancel(run_id)
    with pytest.raises(PipelineError, match="runs pipeline 'labeller', not 'fixer'"):
        conductor.resume(run_id, pipeline=load_pipeline("fixer"))


def test_a_pinned_spec_that_was_altered_is_refused(
    conductor: Conductor, spec_file: Path, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(spec_file))
    altered = json.loads(redis_client.get(keys.pipeline(run_id)) or "")
    altered["stages"][0]["instruction"] = "Do something else {issue}"
    redis_client.set(keys.pipeline(run_id), json.dumps(altered))
    run = conductor.store.get(run_id)
    with pytest.raises(PipelineError, match=rf"run {run_id}: .*does not match its digest"):
        conductor.pipeline_of(run.model_copy(update={"pipeline_hash": "0" * 64}))


def stuck(conductor: Conductor, redis_client: redis.Redis, pipeline: str, queue: str) -> str:
    """A run whose first stage's message is gone."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=pipeline, force=True)
    redis_client.delete(queue)
    return run_id


def test_one_bad_run_never_stops_the_reconcilers_pass(
    conductor: Conductor, spec_file: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    corrupt = stuck(conductor, redis_client, str(spec_file), "baton.labeller.triage")
    redis_client.hset(keys.run(corrupt), "meta", "{not json")
    unseen = f'description = "{time.time_ns()}"\n{SPEC}'  # a version no process has cached
    lost_spec = stuck(
        conductor, redis_client, str(_spec(tmp_path, unseen)), "baton.labeller.triage"
    )
    redis_client.delete(keys.pipeline(lost_spec))
    healthy = stuck(conductor, redis_client, "fixer", "baton.fixer.triage")
    assert conductor.store.active() == sorted([corrupt, lost_spec, healthy])

    sweep = Reconciler(conductor, QUEUE).sweep(now=time.time() + 120)

    assert sweep.repairs == [Repair(healthy, "triage", "queued")]
    assert queued_task_ids(redis_client, "baton.fixer.triage") == [f"{healthy}.triage"]
    assert list(sweep.errors) == [corrupt]
    assert "JSONDecodeError" in sweep.errors[corrupt]
    assert list(sweep.failed) == [lost_spec]
    failed = conductor.store.get(lost_spec)
    assert failed.status == RunStatus.FAILED
    assert failed.stages["triage"].status == StageStatus.FAILED
    assert failed.reason == (
        f"triage: cannot be run: run {lost_spec}: pipeline 'labeller' "
        f"({digest_of(unseen)[:12]}): the pinned pipeline spec is missing"
    )


def test_the_reconciler_routes_a_run_whose_schemas_it_cannot_import(
    conductor: Conductor, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A process that serves other pipelines (no schemas of this one) still sends its stuck
    stages again: routing reads the pinned spec, never imports its schemas."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=str(_spec(tmp_path, SPEC)))
    triage = "orchestrator.pipelines.fixer.schemas:Triage"
    elsewhere = SPEC.replace(triage, "labeller_only.schemas:Label")
    content = json.dumps(tomllib.loads(elsewhere), sort_keys=True, separators=(",", ":"))
    redis_client.set(keys.pipeline(run_id), content)
    redis_client.hset(
        keys.run(run_id),
        "meta",
        json.dumps({**json.loads(redis_client.hget(keys.run(run_id), "meta") or ""),
                    "pipeline_hash": digest_of(elsewhere)}),
    )  # fmt: skip
    redis_client.delete("baton.labeller.triage")

    sweep = Reconciler(conductor, QUEUE).sweep(now=time.time() + 120)

    assert sweep.repairs == [Repair(run_id, "triage", "queued")]
    assert queued_task_ids(redis_client, "baton.labeller.triage") == [f"{run_id}.triage"]
    with pytest.raises(PipelineError, match=r"labeller_only\.schemas:Label"):
        conductor.pipeline_of(conductor.store.get(run_id))


def test_a_message_left_in_a_queue_the_stage_no_longer_uses_is_sent_again(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    """Queues were `baton.<stage>` before they were per pipeline: a message still waiting in
    the old queue, which no worker serves now, is sent again to the stage's queue."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline="fixer")
    redis_client.rename("baton.fixer.triage", "baton.triage")

    sweep = Reconciler(conductor, QUEUE).sweep(now=time.time() + 120)

    assert sweep.repairs == [Repair(run_id, "triage", "queued")]
    assert queued_task_ids(redis_client, "baton.fixer.triage") == [f"{run_id}.triage"]


def _spec(folder: Path, text: str) -> Path:
    path = folder / "spec.toml"
    path.write_text(text)
    return path

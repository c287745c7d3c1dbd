"""The conductor's transitions against a real Redis: messages land on the real stage queues."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from orchestrator import keys
from orchestrator.conductor import Conductor, StageResult
from orchestrator.models import Issue, IssueSource, RunStatus, StageStatus
from orchestrator.queue import Dispatcher
from orchestrator.settings import QueueConfig
from orchestrator.store import RunStore

ISSUE = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart", body="boom")


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def queued_task_ids(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


def result(output: dict[str, object]) -> StageResult:
    return StageResult(
        output=output, requests=2, prompt_tokens_total=300, prompt_tokens_max=200, output_tokens=40
    )


TRIAGE_OK = {
    "actionable": True,
    "reason": "a bug",
    "severity": "high",
    "error_summary": "crash",
}


def test_submit_creates_a_run_and_enqueues_triage_once(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, created = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    again, created_again = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")

    assert (created, created_again, again) == (True, False, run_id)
    assert queued_task_ids(redis_client, "baton.triage") == [f"{run_id}.triage"]
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.QUEUED
    assert run.stages["triage"].status == StageStatus.QUEUED
    assert [run.stages[s].status for s in ("search", "plan", "fix", "pr")] == [
        StageStatus.PENDING
    ] * 4


def test_force_starts_a_second_run_for_the_same_issue(conductor: Conductor) -> None:
    first, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    second, created = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer", force=True)
    assert created and second != first


def test_complete_records_output_and_enqueues_the_next_stage(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    start = conductor.begin(run_id, "triage", task_id="t")
    assert (start.action, start.attempt) == ("run", 1)

    nxt = conductor.complete(run_id, "triage", result(TRIAGE_OK))

    assert nxt == "search"
    assert conductor.store.output(run_id, "triage") == TRIAGE_OK
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.status, record.requests, record.prompt_tokens_max) == (StageStatus.DONE, 2, 200)
    assert record.session_id == f"{run_id}:triage:1"
    assert queued_task_ids(redis_client, "baton.search") == [f"{run_id}.search"]


def test_redelivered_stage_only_advances_and_never_enqueues_twice(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    conductor.begin(run_id, "triage", task_id="t")
    conductor.complete(run_id, "triage", result(TRIAGE_OK))

    redelivered = conductor.begin(run_id, "triage", task_id="t")
    conductor.advance(run_id, "triage")
    conductor.complete(run_id, "triage", result({**TRIAGE_OK, "reason": "other"}))

    assert redelivered.action == "advance"
    assert conductor.store.output(run_id, "triage") == TRIAGE_OK
    assert conductor.store.get(run_id).stages["triage"].attempts == 1
    assert queued_task_ids(redis_client, "baton.search") == [f"{run_id}.search"]


def test_not_actionable_triage_ends_the_run_as_skipped(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    conductor.begin(run_id, "triage", task_id="t")
    conductor.complete(
        run_id, "triage", result({**TRIAGE_OK, "actionable": False, "reason": "not our code"})
    )

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.SKIPPED
    assert run.reason == "triage: not our code"
    assert run.stages["search"].status == StageStatus.SKIPPED


def test_last_stage_done_ends_the_run_and_removes_temp_outputs(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    redis_client.hset(keys.outputs(run_id), "temp:scratch", "{}")
    for stage, output in [
        ("triage", TRIAGE_OK),
        (
            "search",
            {
                "root_cause": "x",
                "locations": [{"path": "a", "line_start": 1, "line_end": 2, "why": "y"}],
            },
        ),
        ("plan", {"approach": "a", "steps": ["s"], "files_to_change": ["a"], "test_command": "t"}),
        (
            "fix",
            {"summary": "s", "files_changed": ["a"], "test_command": "t", "tests_passed": True},
        ),
        ("pr", {"branch": "b", "commit": "c", "title": "t", "body": "b"}),
    ]:
        conductor.begin(run_id, stage, task_id=stage)
        conductor.complete(run_id, stage, result(output))

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.DONE
    assert sorted(redis_client.hkeys(keys.outputs(run_id))) == [
        "fix",
        "plan",
        "pr",
        "search",
        "triage",
    ]
    assert 0 < redis_client.ttl(keys.run(run_id)) <= 3600


def test_wait_shows_until_when_and_begin_resumes(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    conductor.begin(run_id, "triage", task_id="t")
    record = conductor.wait(run_id, "triage", delay_s=3.5, reason="429")
    run = conductor.store.get(run_id)

    assert run.status == RunStatus.WAITING
    assert record.status == StageStatus.WAITING and record.waiting_until is not None
    assert (record.rate_limit_retries, record.rate_limit_wait_s) == (1, 3.5)
    again = conductor.begin(run_id, "triage", task_id="t")
    assert (again.action, again.attempt) == ("run", 2)
    assert conductor.store.get(run_id).stages["triage"].waiting_until is None


def test_fail_ends_the_run_with_the_stage_and_reason(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    conductor.begin(run_id, "triage", task_id="t")
    conductor.fail(run_id, "triage", "the model API refused the request")

    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (
        RunStatus.FAILED,
        "triage: the model API refused the request",
    )
    assert conductor.begin(run_id, "triage", task_id="t").action == "drop"


def test_every_transition_is_in_the_audit_log_with_branch_and_session(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    conductor.begin(run_id, "triage", task_id="t")
    conductor.fail(run_id, "triage", "boom")

    log = conductor.store.audit_log(run_id)
    assert [(e["kind"], e["branch"], e["session"]) for e in log] == [
        ("stage_begin", "fixer.triage", f"{run_id}:triage:1"),
        ("stage_failed", "fixer.triage", f"{run_id}:triage:1"),
    ]

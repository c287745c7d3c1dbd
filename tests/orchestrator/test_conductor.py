"""The conductor's transitions against a real Redis: messages land on the real stage queues.

The stop rule's and the loop's tests run over the fixer and its renamed twin (`names`,
`tests/twin.py`): written in the fixer's names, they hand the conductor outputs in the
pipeline's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.core import gates, keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import RunStateError
from orchestrator.core.execution import (
    Completion,
    Hold,
    StageFigures,
    StageResult,
    StageStart,
    StartAction,
)
from orchestrator.core.models import ArtifactRef, Issue, IssueSource, RunStatus, StageStatus
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore
from tests.twin import FIXER_SPEC, Names

ISSUE = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart", body="boom")


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def begin(
    conductor: Conductor, run_id: str, stage: str, owner: str = "host:1:t", lease_s: float = 30.0
) -> StageStart:
    return conductor.begin(run_id, stage, owner=owner, lease_s=lease_s, max_interrupted=3)


def queued_task_ids(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


FIGURES = StageFigures(requests=2, prompt_tokens_total=300, prompt_tokens_max=200, output_tokens=40)


def result(output: dict[str, object]) -> StageResult:
    return StageResult(output=output, figures=FIGURES)


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
    assert queued_task_ids(redis_client, "baton.fixer.triage") == [f"{run_id}.triage"]
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.QUEUED
    assert run.stages["triage"].status == StageStatus.QUEUED
    assert [run.stages[s].status for s in ("search", "plan", "reproduce", "fix", "pr")] == [
        StageStatus.PENDING
    ] * 5


def test_force_starts_a_second_run_for_the_same_issue(conductor: Conductor) -> None:
    first, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    second, created = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer", force=True)
    assert created and second != first


def test_complete_records_output_and_enqueues_the_next_stage(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    start = begin(conductor, run_id, "triage")
    assert (start.action, start.attempt) == (StartAction.RUN, 1)

    done = conductor.complete(run_id, "triage", result(TRIAGE_OK), owner="host:1:t")

    assert done == Completion.RECORDED
    assert conductor.store.get(run_id).current_stage == "search"
    assert conductor.store.output(run_id, "triage") == TRIAGE_OK
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.status, record.requests, record.prompt_tokens_max) == (StageStatus.DONE, 2, 200)
    assert record.session_id == f"{run_id}:triage:1"
    assert queued_task_ids(redis_client, "baton.fixer.search") == [f"{run_id}.search"]


def test_redelivered_stage_only_advances_and_never_enqueues_twice(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    conductor.complete(run_id, "triage", result(TRIAGE_OK))

    redelivered = begin(conductor, run_id, "triage")
    conductor.advance(run_id, "triage")
    conductor.complete(run_id, "triage", result({**TRIAGE_OK, "reason": "other"}))

    assert redelivered.action == "advance"
    assert conductor.store.output(run_id, "triage") == TRIAGE_OK
    assert conductor.store.get(run_id).stages["triage"].attempts == 1
    assert queued_task_ids(redis_client, "baton.fixer.search") == [f"{run_id}.search"]


def test_not_actionable_triage_ends_the_run_as_skipped(conductor: Conductor, names: Names) -> None:
    triage = names.stage("triage")
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=names.pipeline)
    begin(conductor, run_id, triage)
    said = {**TRIAGE_OK, "actionable": False, "reason": "not our code"}
    conductor.complete(run_id, triage, result(names.output("triage", said)))

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.SKIPPED
    assert run.reason == f"{triage}: not our code"
    assert run.stages[names.stage("search")].status == StageStatus.SKIPPED


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
        ("reproduce", {"test_files": ["t.py"], "test_command": "t", "expected_failure": "E"}),
        ("fix", {"summary": "s", "files_changed": ["a"], "proof": {"passed": True}}),
        ("pr", {"branch": "b", "commit": "c", "title": "t", "body": "b"}),
    ]:
        begin(conductor, run_id, stage)
        conductor.complete(run_id, stage, result(output))

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.DONE
    assert sorted(redis_client.hkeys(keys.outputs(run_id))) == [
        "fix",
        "fix.1",  # each iteration's output of the looped stage
        "plan",
        "pr",
        "reproduce",
        "search",
        "triage",
    ]
    assert 0 < redis_client.ttl(keys.run(run_id)) <= 3600


def test_wait_shows_until_when_and_begin_resumes(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    record = conductor.postpone(run_id, "triage", delay_s=3.5, reason="429")
    run = conductor.store.get(run_id)

    assert run.status == RunStatus.WAITING
    assert record.status == StageStatus.WAITING and record.waiting_until is not None
    assert (record.rate_limit_retries, record.rate_limit_wait_s) == (1, 3.5)
    again = begin(conductor, run_id, "triage")
    assert (again.action, again.attempt) == ("run", 2)
    assert conductor.store.get(run_id).stages["triage"].waiting_until is None


def test_fail_ends_the_run_with_the_stage_and_reason(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    conductor.fail(run_id, "triage", "the model API refused the request")

    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (
        RunStatus.FAILED,
        "triage: the model API refused the request",
    )
    assert begin(conductor, run_id, "triage").action == "drop"


def test_every_transition_is_in_the_audit_log_with_branch_and_session(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    conductor.fail(run_id, "triage", "boom")

    log = conductor.store.audit_log(run_id)
    assert [(e["kind"], e["branch"], e["session"]) for e in log] == [
        ("stage_begin", "fixer.triage", f"{run_id}:triage:1"),
        ("stage_failed", "fixer.triage", f"{run_id}:triage:1"),
    ]


def test_a_delivery_for_a_stage_a_live_execution_holds_is_busy(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    first = begin(conductor, run_id, "triage", owner="host:1:a")
    duplicate = begin(conductor, run_id, "triage", owner="host:2:a")

    assert (first.action, duplicate.action) == ("run", "busy")
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.owner, record.attempts, record.interrupted) == ("host:1:a", 1, 0)


def test_a_lapsed_lease_counts_as_an_interruption_and_the_stage_is_taken_over(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=-1)
    again = begin(conductor, run_id, "triage", owner="host:2:a")

    assert (again.action, again.attempt) == ("run", 2)
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.owner, record.interrupted) == ("host:2:a", 1)


def test_a_stage_interrupted_too_often_is_exhausted(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    actions = [
        begin(conductor, run_id, "triage", owner=f"host:{n}:a", lease_s=-1).action for n in range(5)
    ]

    assert actions == ["run", "run", "run", "exhausted", "exhausted"]


def test_renewing_extends_only_the_owners_lease_and_reports_a_cancel(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=5)
    before = conductor.store.get(run_id).stages["triage"].lease_until

    assert conductor.renew(run_id, "triage", owner="host:1:a", lease_s=100) == Hold.HELD
    assert conductor.renew(run_id, "triage", owner="host:9:z", lease_s=1000) == Hold.LOST
    after = conductor.store.get(run_id).stages["triage"].lease_until
    conductor.cancel(run_id, "stop")
    assert conductor.renew(run_id, "triage", owner="host:1:a", lease_s=100) == Hold.CANCELLED
    assert conductor.hold(run_id, "triage", owner="host:1:a") == Hold.CANCELLED
    assert before is not None and after is not None and 90 < after - before < 100


def test_cancel_ends_the_run_and_a_queued_stage_is_then_dropped(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")

    assert conductor.cancel(run_id, "no longer needed") is True
    assert conductor.cancel(run_id, "again") is False
    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "no longer needed")
    assert run.stages["triage"].status == StageStatus.CANCELLED
    assert begin(conductor, run_id, "triage").action == "drop"
    assert run_id not in conductor.store.active()


def test_a_failure_from_an_execution_that_lost_the_stage_changes_nothing(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=-1)
    begin(conductor, run_id, "triage", owner="host:2:a")

    conductor.fail(run_id, "triage", "late failure", owner="host:1:a")

    run = conductor.store.get(run_id)
    assert (run.status, run.stages["triage"].status) == (RunStatus.RUNNING, StageStatus.RUNNING)


PLAN = {"approach": "a", "steps": ["s"], "files_to_change": ["a"], "test_command": "t"}
SEARCH = {
    "root_cause": "x",
    "locations": [{"path": "a", "line_start": 1, "line_end": 2, "why": "y"}],
}


def test_resume_reruns_from_the_failed_stage_and_keeps_earlier_outputs(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    for stage, output in [
        ("triage", TRIAGE_OK), ("search", SEARCH), ("plan", PLAN), ("reproduce", {"r": 1})
    ]:  # fmt: skip
        begin(conductor, run_id, stage)
        conductor.complete(run_id, stage, result(output))
    begin(conductor, run_id, "fix")
    conductor.fail(run_id, "fix", "tests still fail")
    assert 0 < redis_client.ttl(keys.run(run_id))

    resumed = conductor.resume(run_id)

    run = conductor.store.get(run_id)
    assert resumed == "fix"
    assert (run.status, run.reason, run.current_stage) == (RunStatus.QUEUED, None, "fix")
    assert [
        run.stages[s].status for s in ("triage", "search", "plan", "reproduce", "fix", "pr")
    ] == [
        StageStatus.DONE,
        StageStatus.DONE,
        StageStatus.DONE,
        StageStatus.DONE,
        StageStatus.QUEUED,
        StageStatus.PENDING,
    ]
    assert run.stages["fix"].attempts == 1 and run.stages["fix"].error is None
    assert conductor.store.output(run_id, "plan") == PLAN
    assert redis_client.ttl(keys.run(run_id)) == -1
    assert run_id in conductor.store.active()
    # No worker consumes here: the first message (from plan) is still queued beside resume's.
    assert queued_task_ids(redis_client, "baton.fixer.fix") == [f"{run_id}.fix"] * 2


def test_resume_from_a_named_stage_drops_its_output_and_those_after_it(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    for stage, output in [("triage", TRIAGE_OK), ("search", SEARCH)]:
        begin(conductor, run_id, stage)
        conductor.complete(run_id, stage, result(output))
    conductor.cancel(run_id)

    assert conductor.resume(run_id, "search") == "search"
    assert conductor.store.output(run_id, "search") is None
    assert conductor.store.output(run_id, "triage") == TRIAGE_OK


def test_a_run_still_going_cannot_be_resumed(conductor: Conductor) -> None:
    from orchestrator.core.errors import RunStateError

    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    with pytest.raises(RunStateError, match="is still queued; cancel it first"):
        conductor.resume(run_id)


def test_a_429_after_the_run_was_cancelled_neither_revives_it_nor_retries(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a")
    conductor.cancel(run_id, "stop")

    assert conductor.postpone(run_id, "triage", delay_s=5, reason="429", owner="host:1:a") is None

    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "stop")
    assert run.stages["triage"].rate_limit_retries == 0
    assert run_id not in conductor.store.active()


def test_only_the_execution_holding_a_stage_may_put_it_to_wait(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=-1)
    begin(conductor, run_id, "triage", owner="host:2:b")  # took over the lapsed lease

    assert conductor.postpone(run_id, "triage", delay_s=5, reason="429", owner="host:1:a") is None
    record = conductor.postpone(run_id, "triage", delay_s=5, reason="429", owner="host:2:b")

    assert record is not None and record.status == StageStatus.WAITING
    assert record.rate_limit_retries == 1


def test_a_cancelled_run_whose_stage_is_still_stopping_cannot_be_resumed_yet(
    conductor: Conductor,
) -> None:
    from orchestrator.core.errors import RunStateError

    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=30)
    conductor.cancel(run_id, "stop")

    with pytest.raises(RunStateError, match=r"stage triage of run .* is still stopping"):
        conductor.resume(run_id)
    assert conductor.store.get(run_id).status == RunStatus.CANCELLED

    conductor.stopped(run_id, "triage", owner="host:1:a")
    assert conductor.resume(run_id) == "triage"


def test_a_wait_for_a_failure_outside_the_stage_counts_apart_from_429s(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    conductor.postpone(run_id, "triage", delay_s=2, reason="429")
    begin(conductor, run_id, "triage")
    record = conductor.postpone(run_id, "triage", delay_s=5, reason="docker", rate_limited=False)

    assert record is not None
    assert (record.attempts, record.rate_limit_retries, record.infrastructure_retries) == (2, 1, 1)
    assert record.rate_limit_wait_s == 2


def test_an_output_finished_after_the_cancel_is_not_recorded(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    """The check and the write are one transaction: nothing lands once the run is cancelled."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a")
    conductor.cancel(run_id, "stop")

    done = conductor.complete(run_id, "triage", result(TRIAGE_OK), owner="host:1:a")

    assert done == Completion.CANCELLED
    assert conductor.store.output(run_id, "triage") is None
    record = conductor.store.get(run_id).stages["triage"]
    assert (record.status, record.requests) == (StageStatus.CANCELLED, 2)
    assert queued_task_ids(redis_client, "baton.fixer.search") == []
    assert conductor.store.get(run_id).status == RunStatus.CANCELLED


def test_an_output_from_an_execution_that_lost_the_stage_is_not_recorded(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=-1)
    begin(conductor, run_id, "triage", owner="host:2:b")

    done = conductor.complete(run_id, "triage", result(TRIAGE_OK), owner="host:1:a")

    assert done == Completion.LOST
    assert conductor.hold(run_id, "triage", owner="host:1:a") == Hold.LOST
    assert conductor.hold(run_id, "triage", owner="host:2:b") == Hold.HELD
    assert conductor.store.output(run_id, "triage") is None
    assert conductor.store.get(run_id).stages["triage"].owner == "host:2:b"


def test_a_failed_stage_keeps_what_its_execution_cost_and_left_behind(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a")
    log = ArtifactRef(run_id=run_id, name="triage/tests-after.log", size_bytes=3, sha256="0" * 64)
    figures = StageFigures(
        requests=5, prompt_tokens_total=900, prompt_tokens_max=300, artifacts={"log": log}
    )

    conductor.fail(run_id, "triage", "the tests still fail", owner="host:1:a", figures=figures)

    record = conductor.store.get(run_id).stages["triage"]
    assert (record.status, record.requests, record.prompt_tokens_total) == (
        StageStatus.FAILED,
        5,
        900,
    )
    assert record.artifacts == {"log": log}


def test_resuming_a_run_with_nothing_left_says_how_to_run_stages_again(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage")
    conductor.complete(run_id, "triage", result({**TRIAGE_OK, "actionable": False}))

    with pytest.raises(RunStateError) as caught:
        conductor.resume(run_id)

    message = str(caught.value)
    assert "--from STAGE" in message
    assert "triage, search, plan, reproduce, fix, review, pr" in message


def pending_entry(kind: str) -> dict[str, str]:
    return {"ts": "1.0", "branch": "fixer.triage", "session": "s", "kind": kind}


def test_an_executions_pending_audit_entries_are_written_before_its_stage_done(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:t")
    figures = StageFigures(
        requests=1, audit=(pending_entry("user_message"), pending_entry("model_reply"))
    )

    conductor.complete(run_id, "triage", StageResult(TRIAGE_OK, figures), owner="host:1:t")

    kinds = [e["kind"] for e in conductor.store.audit_log(run_id)]
    assert kinds == ["stage_begin", "user_message", "model_reply", "stage_done"]


def test_pending_audit_entries_are_written_even_when_the_output_is_refused(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline="fixer")
    begin(conductor, run_id, "triage", owner="host:1:a", lease_s=-1)
    begin(conductor, run_id, "triage", owner="host:2:b")  # took over the lapsed lease
    late = StageFigures(audit=(pending_entry("model_reply"),))

    done = conductor.complete(run_id, "triage", StageResult(TRIAGE_OK, late), owner="host:1:a")
    conductor.fail(run_id, "triage", "late", owner="host:1:a", figures=late)

    assert done == Completion.LOST
    kinds = [e["kind"] for e in conductor.store.audit_log(run_id)]
    assert kinds == ["stage_begin", "stage_begin", "model_reply", "model_reply"]
    assert conductor.store.get(run_id).stages["triage"].owner == "host:2:b"


# -- loops ------------------------------------------------------------------------------------

BEFORE_FIX = ("triage", "search", "plan", "reproduce")


def at_fix(conductor: Conductor, names: Names) -> str:
    """A run whose stages before fix are done (their outputs stand in for the real ones)."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=names.pipeline)
    for stage in BEFORE_FIX:
        begin(conductor, run_id, names.stage(stage))
        output = names.output("triage", TRIAGE_OK) if stage == "triage" else {"stage": stage}
        assert conductor.complete(run_id, names.stage(stage), result(output),
                                  owner="host:1:t") == Completion.RECORDED  # fmt: skip
    return run_id


def fix_output(names: Names, passed: bool, reason: str) -> dict[str, object]:
    said = {"summary": "changed cart.py", "proof": {"passed": passed, "reason": reason}}
    return names.output("fix", said)


def test_a_fix_whose_proof_fails_runs_again_as_its_next_iteration(
    conductor: Conductor, redis_client: redis.Redis, names: Names
) -> None:
    fix, review = names.stage("fix"), names.stage("review")
    run_id = at_fix(conductor, names)
    assert queued_task_ids(redis_client, names.queue("fix")) == [f"{run_id}.{fix}"]
    begin(conductor, run_id, fix, owner="w:1")

    conductor.complete(run_id, fix, result(fix_output(names, False, "1 still fails")), owner="w:1")

    run = conductor.store.get(run_id)
    record = run.stages[fix]
    assert (run.status, run.current_stage) == (RunStatus.RUNNING, fix)
    assert (record.status, record.iteration) == (StageStatus.QUEUED, 2)
    assert [(i.number, i.attempt, i.passed, i.reason, i.requests) for i in record.iterations] == [
        (1, 1, False, "1 still fails", 2)
    ]
    assert sorted(queued_task_ids(redis_client, names.queue("fix"))) == [
        f"{run_id}.{fix}",
        f"{run_id}.{fix}.2",
    ]
    assert queued_task_ids(redis_client, names.queue("review")) == []
    assert conductor.store.output(run_id, f"{fix}.1") == fix_output(names, False, "1 still fails")

    second = begin(conductor, run_id, fix, owner="w:2")
    assert (second.action, second.attempt) == (StartAction.RUN, 2)  # a fresh session
    assert conductor.store.get(run_id).stages[fix].session_id == f"{run_id}:{fix}:2"
    conductor.complete(run_id, fix, result(fix_output(names, True, "proven")), owner="w:2")

    run = conductor.store.get(run_id)
    assert (run.stages[fix].status, run.stages[fix].iteration) == (StageStatus.DONE, 2)
    assert [i.passed for i in run.stages[fix].iterations] == [False, True]
    assert conductor.store.output(run_id, fix) == fix_output(names, True, "proven")
    assert queued_task_ids(redis_client, names.queue("review")) == [f"{run_id}.{review}"]
    kinds = [e["kind"] for e in conductor.store.audit_log(run_id)]
    assert kinds.count("iteration_done") == 2


def test_a_loop_that_runs_out_fails_the_run_with_the_last_reason(
    conductor: Conductor, redis_client: redis.Redis, names: Names
) -> None:
    fix, pr = names.stage("fix"), names.stage("pr")
    run_id = at_fix(conductor, names)
    for number in (1, 2, 3):
        begin(conductor, run_id, fix, owner=f"w:{number}")
        said = fix_output(names, False, f"attempt {number}: 1 still fails")
        conductor.complete(run_id, fix, result(said), owner=f"w:{number}")

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason == f"{fix}: attempt 3: 1 still fails (after 3 iterations)"
    assert run.stages[fix].status == StageStatus.FAILED
    assert len(run.stages[fix].iterations) == 3
    assert run.stages[pr].status == StageStatus.PENDING
    assert sorted(queued_task_ids(redis_client, names.queue("fix"))) == [
        f"{run_id}.{fix}", f"{run_id}.{fix}.2", f"{run_id}.{fix}.3"
    ]  # fmt: skip
    assert queued_task_ids(redis_client, names.queue("pr")) == []

    assert conductor.resume(run_id) == fix  # a resumed loop starts again at its first
    record = conductor.store.get(run_id).stages[fix]
    assert (record.iteration, record.iterations, record.attempts) == (1, [], 3)


# -- a review's send_back ---------------------------------------------------------------------


def review_output(names: Names, *problems: str) -> dict[str, object]:
    said = {"reproduces_report": True, "fixes_cause": not problems, "problems": list(problems)}
    return names.output("review", said)


def at_review(conductor: Conductor, names: Names) -> str:
    """A run whose fix passed its first iteration: its review is queued."""
    run_id = at_fix(conductor, names)
    fix = names.stage("fix")
    begin(conductor, run_id, fix, owner="w:1")
    conductor.complete(run_id, fix, result(fix_output(names, True, "proven")), owner="w:1")
    return run_id


def _at_fix_of(conductor: Conductor, pipeline: str) -> str:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=pipeline)
    for stage in BEFORE_FIX:
        begin(conductor, run_id, stage)
        output = TRIAGE_OK if stage == "triage" else {"stage": stage}
        conductor.complete(run_id, stage, result(output), owner="host:1:t")
    return run_id


def test_a_review_that_refuses_sends_the_run_back_to_the_fix_as_its_next_iteration(
    conductor: Conductor, redis_client: redis.Redis, names: Names
) -> None:
    fix, review, pr = names.stage("fix"), names.stage("review"), names.stage("pr")
    run_id = at_review(conductor, names)
    assert queued_task_ids(redis_client, names.queue("review")) == [f"{run_id}.{review}"]
    begin(conductor, run_id, review, owner="r:1")

    refusal = review_output(names, "it special-cases n == 5", "the cause is untouched")
    conductor.complete(run_id, review, result(refusal), owner="r:1")

    run = conductor.store.get(run_id)
    why = f"{review} refused it: it special-cases n == 5; the cause is untouched"
    assert (run.status, run.current_stage) == (RunStatus.RUNNING, fix)
    assert (run.stages[fix].status, run.stages[fix].iteration) == (StageStatus.QUEUED, 2)
    assert [(i.number, i.passed, i.reason) for i in run.stages[fix].iterations] == [(1, False, why)]
    # the review runs again after the next iteration, fresh, its task named by the round
    assert (run.stages[review].status, run.stages[review].attempts) == (StageStatus.PENDING, 1)
    assert run.stages[review].iteration == 2
    assert f"{run_id}.{fix}.2" in queued_task_ids(redis_client, names.queue("fix"))
    assert queued_task_ids(redis_client, names.queue("pr")) == []
    sent = [e for e in conductor.store.audit_log(run_id) if e["kind"] == "sent_back"]
    assert [(e["branch"].rpartition(".")[2], json.loads(e["data"])) for e in sent] == [
        (review, {"to": fix, "iteration": 1, "reason": why})
    ]

    begin(conductor, run_id, fix, owner="w:2")
    conductor.complete(run_id, fix, result(fix_output(names, True, "proven")), owner="w:2")
    assert f"{run_id}.{review}.2" in queued_task_ids(redis_client, names.queue("review"))
    second = begin(conductor, run_id, review, owner="r:2")
    assert (second.action, second.attempt) == (StartAction.RUN, 2)  # a fresh session
    conductor.complete(run_id, review, result(review_output(names)), owner="r:2")

    run = conductor.store.get(run_id)
    assert [i.passed for i in run.stages[fix].iterations] == [False, True]
    assert run.stages[review].status == StageStatus.DONE
    assert queued_task_ids(redis_client, names.queue("pr")) == [f"{run_id}.{pr}"]


def test_a_refusal_of_the_last_iteration_fails_the_run_with_the_reviews_reason(
    conductor: Conductor, redis_client: redis.Redis, names: Names
) -> None:
    fix, review = names.stage("fix"), names.stage("review")
    run_id = at_review(conductor, names)
    for number in (1, 2, 3):
        begin(conductor, run_id, review, owner=f"r:{number}")
        refusal = review_output(names, f"round {number}: the test asserts the bug")
        conductor.complete(run_id, review, result(refusal), owner=f"r:{number}")
        if number < 3:
            begin(conductor, run_id, fix, owner=f"w:{number + 1}")
            passed = fix_output(names, True, "proven")
            conductor.complete(run_id, fix, result(passed), owner=f"w:{number + 1}")

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason == (
        f"{review}: refused the change of {fix}: round 3: the test asserts the bug "
        "(after 3 iterations of it)"
    )
    assert [i.passed for i in run.stages[fix].iterations] == [False, False, False]
    assert queued_task_ids(redis_client, names.queue("pr")) == []


def test_a_review_that_approves_hands_the_fix_on_unchanged(
    conductor: Conductor, redis_client: redis.Redis, names: Names
) -> None:
    fix, review, pr = names.stage("fix"), names.stage("review"), names.stage("pr")
    run_id = at_review(conductor, names)
    begin(conductor, run_id, review, owner="r:1")

    conductor.complete(run_id, review, result(review_output(names)), owner="r:1")

    run = conductor.store.get(run_id)
    assert [(i.number, i.passed) for i in run.stages[fix].iterations] == [(1, True)]
    assert run.stages[review].status == StageStatus.DONE
    assert queued_task_ids(redis_client, names.queue("pr")) == [f"{run_id}.{pr}"]


def test_a_refusal_can_park_the_run_on_a_gate_instead(
    conductor: Conductor, redis_client: redis.Redis, tmp_path: Path
) -> None:
    spec = FIXER_SPEC.read_text()
    rule = 'send_back = { to = "fix", unless = ["reproduces_report", "fixes_cause"], '
    assert rule in spec
    gated = tmp_path / "fixer-gated.toml"
    gated.write_text(spec.replace(rule, rule + 'then = "gate", '))
    run_id = _at_fix_of(conductor, str(gated))
    begin(conductor, run_id, "fix", owner="w:1")
    conductor.complete(run_id, "fix", result({"proof": {"passed": True}}), owner="w:1")
    begin(conductor, run_id, "review", owner="r:1")

    refusal = {"reproduces_report": True, "fixes_cause": False,
               "problems": ["the test asserts the bug"]}  # fmt: skip
    conductor.complete(run_id, "review", result(refusal), owner="r:1")

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.AWAITING_APPROVAL and gates.holds(run, "review")
    assert run.gates["review"].approve == "diff"
    assert run.stages["fix"].iterations[-1].reason == "review refused it: the test asserts the bug"
    assert queued_task_ids(redis_client, "baton.fixer.pr") == []
    conductor.approve(run_id, "review", by="ana")
    assert queued_task_ids(redis_client, "baton.fixer.pr") == [f"{run_id}.pr"]


def test_a_stale_delivery_of_an_earlier_iteration_runs_nothing_twice(
    conductor: Conductor, names: Names
) -> None:
    fix = names.stage("fix")
    run_id = at_fix(conductor, names)
    begin(conductor, run_id, fix, owner="w:1")
    conductor.complete(run_id, fix, result(fix_output(names, False, "no")), owner="w:1")
    begin(conductor, run_id, fix, owner="w:2")  # iteration 2 is running

    late = begin(conductor, run_id, fix, owner="w:3")  # iteration 1's message, again

    assert late.action == StartAction.BUSY
    conductor.complete(run_id, fix, result(fix_output(names, True, "proven")), owner="w:2")
    assert begin(conductor, run_id, fix, owner="w:3").action == StartAction.ADVANCE

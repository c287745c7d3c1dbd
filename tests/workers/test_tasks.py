"""How the stage task settles an execution that ended without output: the error's own answer
(`ExecutionError.retry`), recorded through the conductor, with what the execution cost. The
conductor here is a recorder of our own interface; no Redis, no broker."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import Held, Hold
from orchestrator.core.models import Issue, IssueSource, RunRecord, StageRecord
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import ModelConfig, RetryConfig
from workers import tasks
from workers.errors import (
    InfrastructureError,
    LeaseLostError,
    RateLimitedError,
    StageCancelledError,
    StageError,
)
from workers.execution import Execution, WorkerServices
from workers.holding import holding

PIPELINE = load_pipeline("fixer")


class RecordingConductor:
    """Records the transitions the task asks for; `postpone` answers `held`."""

    store = None  # an execution's artifacts go nowhere here: none is saved

    def __init__(self, *, held: bool = True) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.held = held

    def stopped(self, run_id: str, stage: str, **kwargs: Any) -> None:
        self.calls.append(("stopped", kwargs))

    def fail(self, run_id: str, stage: str, error: str, **kwargs: Any) -> None:
        self.calls.append(("fail", {"error": error, **kwargs}))

    def hold(self, run_id: str, stage: str, *, owner: str) -> Hold:
        return Hold.HELD

    def postpone(self, run_id: str, stage: str, **kwargs: Any) -> StageRecord | None:
        self.calls.append(("postpone", kwargs))
        return StageRecord() if self.held else None


class RetryRaised(Exception):
    """What the task stand-in's `retry` returns, for the task to raise (Celery's `Retry`)."""

    def __init__(self, countdown: float) -> None:
        super().__init__(countdown)
        self.countdown = countdown


class TaskStandIn:
    def retry(self, *, countdown: float, exc: BaseException) -> RetryRaised:
        return RetryRaised(countdown)


def execution(conductor: RecordingConductor, record: StageRecord | None = None) -> Execution:
    run = RunRecord(
        id="r1", pipeline="fixer", repo="/r", commit="c" * 40,
        issue=Issue(source=IssueSource.TEXT, title="t"), idempotency_key="k",
        stages={"search": record or StageRecord()},
    )  # fmt: skip
    services = WorkerServices(
        conductor=conductor,  # type: ignore[arg-type]
        sandboxes=None,  # type: ignore[arg-type]
        publisher=None,  # type: ignore[arg-type]
        governor=None,
        model=ModelConfig(),
        retry=RetryConfig(rate_limit_jitter_s=0.5),
    )
    held = holding(conductor, Held("r1", "search"), "h:1:t")  # type: ignore[arg-type]
    made = Execution(services, run, PIPELINE, PIPELINE.stage("search"), attempt=1, holding=held)
    made.usage.requests = 3
    return made


def test_a_cancelled_execution_is_recorded_stopped_with_what_it_cost() -> None:
    conductor = RecordingConductor()

    outcome = tasks._settle(TaskStandIn(), execution(conductor), StageCancelledError())

    assert outcome == "cancelled"
    ((verb, kwargs),) = conductor.calls
    assert (verb, kwargs["owner"], kwargs["figures"].requests) == ("stopped", "h:1:t", 3)


def test_an_execution_that_lost_its_stage_records_nothing() -> None:
    conductor = RecordingConductor()

    outcome = tasks._settle(TaskStandIn(), execution(conductor), LeaseLostError("taken over"))

    assert (outcome, conductor.calls) == ("lost", [])


def test_a_stage_error_fails_the_run_with_its_message_and_the_figures() -> None:
    conductor = RecordingConductor()

    outcome = tasks._settle(TaskStandIn(), execution(conductor), StageError("no sandbox"))

    assert outcome == "failed"
    ((verb, kwargs),) = conductor.calls
    assert (verb, kwargs["error"], kwargs["figures"].requests) == ("fail", "no sandbox", 3)


def test_a_429_goes_back_on_the_queue_after_the_servers_delay() -> None:
    conductor = RecordingConductor()

    with pytest.raises(RetryRaised) as raised:
        tasks._settle(TaskStandIn(), execution(conductor), RateLimitedError("429", 7.0))

    assert 7.0 <= raised.value.countdown <= 7.5
    ((verb, kwargs),) = conductor.calls
    assert (verb, kwargs["delay_s"], kwargs.get("rate_limited", True)) == (
        "postpone",
        raised.value.countdown,
        True,
    )


def test_a_429_past_the_retry_budget_fails_the_run_saying_so() -> None:
    conductor = RecordingConductor()
    spent = StageRecord(rate_limit_retries=RetryConfig().rate_limit_max_retries)

    outcome = tasks._settle(TaskStandIn(), execution(conductor, spent), RateLimitedError("429"))

    assert outcome == "failed"
    ((verb, kwargs),) = conductor.calls
    assert verb == "fail" and "gave up after 8 retries" in kwargs["error"]


def test_an_infrastructure_failure_is_retried_twice_then_fails_the_run() -> None:
    conductor = RecordingConductor()
    with pytest.raises(RetryRaised) as raised:
        tasks._settle(TaskStandIn(), execution(conductor), InfrastructureError("docker gone"))
    assert raised.value.countdown == tasks.INFRASTRUCTURE_BACKOFF_S
    assert conductor.calls[0][1]["rate_limited"] is False

    conductor = RecordingConductor()
    twice = StageRecord(infrastructure_retries=2)
    outcome = tasks._settle(
        TaskStandIn(), execution(conductor, twice), InfrastructureError("docker gone")
    )

    assert outcome == "failed"
    assert conductor.calls[0][1]["error"] == "docker gone (after 3 attempts)"


def test_no_retry_is_sent_for_a_run_that_ended_meanwhile() -> None:
    conductor = RecordingConductor(held=False)

    outcome = tasks._settle(TaskStandIn(), execution(conductor), RateLimitedError("429", 1.0))

    assert outcome == "failed"  # counted as such; nothing goes back on the queue
    assert [verb for verb, _ in conductor.calls] == ["postpone"]


def test_the_recording_conductor_speaks_the_conductors_verbs() -> None:
    for verb in ("stopped", "fail", "postpone", "hold"):
        assert callable(getattr(Conductor, verb))


class AuditStore:
    """The run store's audit side: what each round trip wrote."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []

    def audit(self, run_id: str, entries: list[dict[str, Any]]) -> int:
        self.writes.append([entry["kind"] for entry in entries])
        return len(entries)


def test_audit_entries_wait_for_a_safe_point_and_the_rest_ride_the_settling_figures() -> None:
    conductor = RecordingConductor()
    store = AuditStore()
    conductor.store = store  # type: ignore[assignment]
    made = execution(conductor)

    made.audit([{"kind": "user_message"}, {"kind": "tool_call"}])
    assert store.writes == []
    made.checkpoint()  # before the tool runs: what the watcher should see now goes out
    made.audit([{"kind": "tool_result"}])
    made.audit([{"kind": "model_reply"}])

    assert store.writes == [["user_message", "tool_call"]]
    assert [e["kind"] for e in made.figures().audit] == ["tool_result", "model_reply"]


def test_a_lost_execution_still_writes_its_pending_audit_entries() -> None:
    conductor = RecordingConductor()
    store = AuditStore()
    conductor.store = store  # type: ignore[assignment]
    made = execution(conductor)
    made.audit([{"kind": "model_reply"}])

    outcome = tasks._settle(TaskStandIn(), made, LeaseLostError("taken over"))  # type: ignore[arg-type]

    assert (outcome, conductor.calls, store.writes) == ("lost", [], [["model_reply"]])

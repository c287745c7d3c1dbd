"""What a run is and where it goes next: submit, begin a stage, record it, advance, end.

Every transition is one Redis transaction on the run record, and each one is idempotent: a
redelivered stage whose output is already recorded only advances the run, and a stage is
enqueued only by the transaction that moves it from `pending` to `queued`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator import keys
from orchestrator.models import ArtifactRef, Issue, RunRecord, RunStatus, StageRecord, StageStatus
from orchestrator.pipeline import Pipeline, load_pipeline
from orchestrator.queue import Dispatcher
from orchestrator.store import RunStore

logger = logging.getLogger(__name__)


def new_run_id() -> str:
    """Sortable and readable: `20261129-190833-3fa2c1`."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def session_id(run_id: str, stage: str, attempt: int) -> str:
    return f"{run_id}:{stage}:{attempt}"


def branch_label(pipeline: str, stage: str) -> str:
    return f"{pipeline}.{stage}"


@dataclass(frozen=True)
class StageStart:
    """What `begin` decided for a delivered stage task."""

    action: str
    """`run` (execute it), `advance` (output already recorded) or `drop` (run has ended)."""
    attempt: int = 0
    run: RunRecord | None = None


@dataclass(frozen=True)
class StageResult:
    """A stage's validated output and what it cost."""

    output: dict[str, Any]
    requests: int
    prompt_tokens_total: int
    prompt_tokens_max: int
    output_tokens: int
    compacted: str | None = None
    artifacts: dict[str, ArtifactRef] | None = None


class Conductor:
    """Moves runs through their pipelines."""

    def __init__(self, store: RunStore, dispatcher: Dispatcher) -> None:
        self.store = store
        self.dispatcher = dispatcher

    def submit(
        self, issue: Issue, *, repo: str, commit: str, pipeline: str, force: bool = False
    ) -> tuple[str, bool]:
        """Create a run and enqueue its first stage; an issue seen before maps to its run.

        Returns the run id and whether a new run was created.
        """
        spec = load_pipeline(pipeline)
        run = RunRecord(
            id=new_run_id(),
            pipeline=pipeline,
            repo=repo,
            commit=commit,
            issue=issue,
            idempotency_key=issue.idempotency_key() + f"|{repo}|{pipeline}",
            stages={stage.name: StageRecord() for stage in spec.stages},
        )
        stored, created = self.store.create(run, force=force)
        if created:
            self._enqueue(stored.id, spec, spec.first.name)
            logger.info("run %s created for %s (%s)", stored.id, issue.source.value, pipeline)
        else:
            logger.info("issue already has run %s; not enqueued again", stored.id)
        return stored.id, created

    def begin(self, run_id: str, stage: str, *, task_id: str) -> StageStart:
        """Claim a delivered stage for execution, or say why not."""

        def mutate(run: RunRecord, pipe: Any) -> StageStart:
            record = run.stages.setdefault(stage, StageRecord())
            if run.status.is_terminal:
                return StageStart("drop", run=run)
            if record.status == StageStatus.DONE:
                return StageStart("advance", run=run)
            record.attempts += 1
            record.status = StageStatus.RUNNING
            record.started_at, record.finished_at = time.time(), None
            record.waiting_until = None
            record.error = None
            record.session_id = session_id(run_id, stage, record.attempts)
            run.status, run.current_stage = RunStatus.RUNNING, stage
            return StageStart("run", attempt=record.attempts, run=run)

        start: StageStart = self.store.transact(run_id, mutate)
        self._audit_transition(
            run_id, stage, start.attempt, "stage_begin", action=start.action, task_id=task_id
        )
        return start

    def complete(self, run_id: str, stage: str, result: StageResult) -> str | None:
        """Record a stage's output and advance the run. Returns the next stage, if any."""
        spec = load_pipeline(self.store.get(run_id).pipeline).stage(stage)
        payload = json.dumps(result.output, ensure_ascii=False, separators=(",", ":"))

        def mutate(run: RunRecord, pipe: Any) -> None:
            record = run.stages[stage]
            if record.status == StageStatus.DONE:
                return
            pipe.hset(keys.outputs(run_id), spec.output_key, payload)
            record.status, record.finished_at = StageStatus.DONE, time.time()
            record.requests = result.requests
            record.prompt_tokens_total = result.prompt_tokens_total
            record.prompt_tokens_max = result.prompt_tokens_max
            record.output_tokens = result.output_tokens
            record.output_chars = len(payload)
            record.compacted = result.compacted
            record.artifacts = dict(result.artifacts or {})

        self.store.transact(run_id, mutate)
        return self.advance(run_id, stage)

    def advance(self, run_id: str, completed: str) -> str | None:
        """Enqueue the stage after `completed`, or end the run. Safe to call more than once."""
        run = self.store.get(run_id)
        if run.status.is_terminal:
            return None
        pipeline = load_pipeline(run.pipeline)
        spec = pipeline.stage(completed)
        output = self.store.output(run_id, spec.output_key) or {}
        if spec.stop_when and spec.stop_when.matches(output):
            self._skip_rest(run_id, pipeline, completed)
            self.store.finish(
                run_id, RunStatus.SKIPPED, f"{completed}: {spec.stop_when.reason(output)}"
            )
            return None
        following = pipeline.next_after(completed)
        if following is None:
            self.store.finish(run_id, RunStatus.DONE)
            return None
        self._enqueue(run_id, pipeline, following.name)
        return following.name

    def wait(
        self, run_id: str, stage: str, *, delay_s: float, reason: str, rate_limited: bool = True
    ) -> StageRecord:
        """Mark a stage as waiting until now + delay before its next attempt (a 429, or a
        failure outside the stage when not `rate_limited`)."""

        def mutate(run: RunRecord, pipe: Any) -> StageRecord:
            record = run.stages[stage]
            record.status = StageStatus.WAITING
            record.waiting_until = time.time() + delay_s
            if rate_limited:
                record.rate_limit_wait_s = round(record.rate_limit_wait_s + delay_s, 3)
                record.rate_limit_retries += 1
            record.error = reason
            run.status = RunStatus.WAITING
            return record

        record: StageRecord = self.store.transact(run_id, mutate)
        self._audit_transition(
            run_id, stage, record.attempts, "stage_waiting", delay_s=delay_s, reason=reason
        )
        return record

    def fail(self, run_id: str, stage: str, error: str) -> None:
        """Fail a stage and end its run."""
        self.store.update_stage(
            run_id, stage, status=StageStatus.FAILED, finished_at=time.time(), error=error
        )
        attempt = self.store.get(run_id).stages[stage].attempts
        self._audit_transition(run_id, stage, attempt, "stage_failed", error=error)
        self.store.finish(run_id, RunStatus.FAILED, f"{stage}: {error}")

    def _enqueue(self, run_id: str, pipeline: Pipeline, stage: str) -> None:
        def mutate(run: RunRecord, pipe: Any) -> bool:
            record = run.stages.setdefault(stage, StageRecord())
            if record.status != StageStatus.PENDING or run.status.is_terminal:
                return False
            record.status, record.queued_at = StageStatus.QUEUED, time.time()
            run.current_stage = stage
            return True

        if self.store.transact(run_id, mutate):
            self.dispatcher.send_stage(run_id, pipeline.stage(stage))

    def _skip_rest(self, run_id: str, pipeline: Pipeline, completed: str) -> None:
        def mutate(run: RunRecord, pipe: Any) -> None:
            following = pipeline.next_after(completed)
            while following is not None:
                run.stages[following.name].status = StageStatus.SKIPPED
                following = pipeline.next_after(following.name)

        self.store.transact(run_id, mutate)

    def _audit_transition(
        self, run_id: str, stage: str, attempt: int, kind: str, **data: Any
    ) -> None:
        run = self.store.get(run_id)
        self.store.audit(
            run_id,
            [
                {
                    "ts": repr(time.time()),
                    "branch": branch_label(run.pipeline, stage),
                    "session": session_id(run_id, stage, attempt),
                    "kind": kind,
                    "data": data,
                }
            ],
        )

"""The decisions a run's transactions make, as pure functions of its record: what comes after
a stage, where a resumed run starts, what an ending execution leaves on its stage.

The conductor (`orchestrator.core.conductor`), the fan-in (`orchestrator.core.fanout`) and the
gates (`orchestrator.core.approvals`) call them inside `RunStore.transact`; none of them writes
anywhere but the record and the transaction's pipe it is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core import fanin, gates, keys
from orchestrator.core.errors import RunStateError
from orchestrator.core.execution import Hold, StageFigures
from orchestrator.core.models import RunRecord, RunStatus, StageRecord, StageStatus
from orchestrator.core.pipeline import Pipeline


@dataclass(frozen=True)
class Next:
    """What a run does once a stage is recorded: enqueue a stage, end, or nothing more."""

    send: str | None = None
    ended: bool = False


def compact(output: Mapping[str, Any]) -> str:
    """An output as the store keeps it."""
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"))


def repin(run: RunRecord, pipe: Any, pipeline: Pipeline) -> None:
    """Within `resume`'s transaction: the run pins `pipeline` from now on; its stage records
    follow the new stage order, a new stage's fresh."""
    run.pipeline_hash = pipeline.digest
    pipe.set(keys.pipeline(run.id), pipeline.content)
    names = [stage.name for stage in pipeline.stages]
    others = {name: record for name, record in run.stages.items() if name not in names}
    run.stages = {name: run.stages.get(name) or StageRecord() for name in names} | others


def resume_point(run: RunRecord, names: list[str]) -> str:
    """The first stage a resumed run must run again: the one that failed or was stopped."""
    for name in names:
        if run.stages[name].status not in (StageStatus.DONE, StageStatus.SKIPPED):
            return name
    raise RunStateError(
        f"run {run.id} has nothing left to run: every stage ended {run.status.value} "
        f"({', '.join(names)}); to run stages again, name the first with --from STAGE "
        "(`from_stage=` from Python)"
    )


def hold_of(status: RunStatus, record: StageRecord | None, owner: str) -> Hold:
    """Where `owner` stands with a stage of a run in `status`."""
    if status == RunStatus.CANCELLED:
        return Hold.CANCELLED
    if status.is_terminal or record is None or record.owner != owner:
        return Hold.LOST
    return Hold.HELD


def record_figures(record: StageRecord, figures: StageFigures) -> None:
    """What an execution cost and left behind, on its stage's record (an attempt's own)."""
    record.requests = figures.requests
    record.prompt_tokens_total = figures.prompt_tokens_total
    record.prompt_tokens_max = figures.prompt_tokens_max
    record.output_tokens = figures.output_tokens
    record.artifacts = dict(figures.artifacts)
    record.quota_wait_s = round(record.quota_wait_s + figures.quota_wait_s, 3)


def stop(record: StageRecord, figures: StageFigures | None) -> None:
    """Mark a running stage stopped because its run was cancelled."""
    if figures is not None:
        record_figures(record, figures)
    record.status, record.finished_at = StageStatus.CANCELLED, time.time()
    record.error, record.lease_until = "stopped: the run was cancelled", None


def fresh(record: StageRecord | None) -> StageRecord:
    """A stage record ready to run again; its attempt count carries on (session ids stay
    unique)."""
    return StageRecord(attempts=record.attempts if record else 0)


def fail(run: RunRecord, stage: str, error: str) -> Next:
    """Within a transaction: fail `stage` with `error`, and the run with it."""
    record = run.stages[stage]
    record.status, record.error, record.finished_at = StageStatus.FAILED, error, time.time()
    run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{stage}: {error}", None
    return Next(ended=True)


def skip_rest(run: RunRecord, pipeline: Pipeline, completed: str, reason: str) -> Next:
    """Within a transaction: end the run `skipped` after `completed`, the rest skipped."""
    following = pipeline.next_after(completed)
    while following is not None:
        run.stages[following.name].status = StageStatus.SKIPPED
        following = pipeline.next_after(following.name)
    run.status, run.reason, run.current_stage = RunStatus.SKIPPED, reason, None
    return Next(ended=True)


def decide(run: RunRecord, pipeline: Pipeline, completed: str, output: dict[str, Any]) -> Next:
    """Within a transaction: skip the rest, end the run, or mark the next stage queued."""
    if run.status.is_terminal or gates.holds(run, completed):
        return Next()
    spec = pipeline.stage(completed)
    following = pipeline.next_after(completed)
    if spec.stop_when and spec.stop_when.matches(output):
        return skip_rest(run, pipeline, completed, f"{completed}: {spec.stop_when.reason(output)}")
    if following is None:
        run.status, run.current_stage = RunStatus.DONE, None
        return Next(ended=True)
    record = run.stages.setdefault(following.name, StageRecord())
    if record.status != StageStatus.PENDING:
        return Next()
    record.status, record.queued_at = StageStatus.QUEUED, time.time()
    fanin.open_fan(record, following)
    run.current_stage = following.name
    return Next(send=following.name)

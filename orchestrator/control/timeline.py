"""A run's time line: each stage's time queued, running (per iteration of a looped stage, per
branch of a fan-out stage) and waiting on a rate limit, as spans the web UI draws to scale
(`GET /runs/{id}/timeline`).

A fan-out stage's branches run at once: each has spans of its own, marked with its `branch`,
which the page draws as parallel lanes under the stage's row, the `selected` one marked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from orchestrator.core.branches import branch_number
from orchestrator.core.fanin import BranchStatus, FanIn
from orchestrator.core.models import RunRecord, StageRecord, StageStatus

if TYPE_CHECKING:
    from orchestrator.control.inspection import Entry


class Span(BaseModel):
    """A stretch of a stage's (or one of its branches') time line, in epoch seconds."""

    stage: str
    label: str
    """`fix`, `fix.2` for a looped stage's second iteration, `fix.b2` for a branch."""
    state: Literal["queued", "running", "waiting", "done", "failed", "cancelled", "skipped"]
    start: float
    end: float | None
    """None: still going."""
    note: str = ""
    branch: str | None = None
    """A fan-out stage's branch (`b2`) the span is of; None: the stage's own."""
    selected: bool = False
    """The branch is the one whose output became the stage's."""


def timeline(run: RunRecord, entries: list[Entry]) -> list[Span]:
    """Each stage's time queued, running (per iteration of a looped stage, per branch of a
    fan-out stage) and waiting on a rate limit, from its record and the waits its audit
    entries name."""
    spans: list[Span] = []
    ended = run.updated_at if run.status.is_terminal else None
    for name, record in run.stages.items():
        if record.queued_at and (record.started_at or ended):
            spans.append(
                Span(
                    stage=name,
                    label=name,
                    state="queued",
                    start=record.queued_at,
                    end=record.started_at or ended,
                )
            )
        spans.extend(_running(name, record, ended))
        if record.fan_in is not None:
            spans.extend(_branches(name, record.fan_in, ended))
    for entry in entries:
        if entry.kind == "stage_waiting" and entry.stage:
            delay = float(entry.data.get("delay_s") or 0.0)
            reason = str(entry.data.get("reason") or "")
            spans.append(
                Span(
                    stage=entry.stage,
                    label=entry.stage,
                    state="waiting",
                    start=entry.ts,
                    end=entry.ts + delay,
                    note=reason,
                )
            )
    return sorted(spans, key=lambda s: (s.start, s.stage))


def _running(name: str, record: StageRecord, ended: float | None) -> list[Span]:
    final = _FINAL.get(record.status, "running")
    if record.iterations:
        spans = [
            Span(
                stage=name,
                label=f"{name}.{i.number}" if i.number > 1 else name,
                state="done" if i.passed else "failed",
                start=i.started_at,
                end=i.finished_at,
                note=i.reason,
            )
            for i in record.iterations
            if i.started_at is not None
        ]
        last = record.iterations[-1].number
        if record.iteration > last and record.started_at:  # an iteration going on, or cut short
            spans.append(
                Span(
                    stage=name,
                    label=f"{name}.{record.iteration}",
                    state=final,
                    start=record.started_at,
                    end=record.finished_at or ended,
                )
            )
        return spans
    if record.started_at is None:
        return []
    end = record.finished_at or (ended if final != "running" else None)
    return [
        Span(
            stage=name,
            label=name,
            state=final,
            start=record.started_at,
            end=end,
            note=record.error or "",
        )
    ]


_FINAL: dict[StageStatus, Any] = {
    StageStatus.DONE: "done",
    StageStatus.FAILED: "failed",
    StageStatus.CANCELLED: "cancelled",
    StageStatus.SKIPPED: "skipped",
}


_BRANCH_FINAL: dict[BranchStatus, Any] = {
    BranchStatus.DONE: "done",
    BranchStatus.FAILED: "failed",
    BranchStatus.RUNNING: "running",
}


def _branches(name: str, fan: FanIn, ended: float | None) -> list[Span]:
    """A span per branch that started (its latest execution), in branch order: running, done
    or failed; one the run's end left running is `cancelled` at that end."""
    spans = []
    for branch in sorted(fan.branches, key=branch_number):
        record = fan.branches[branch]
        if record.started_at is None or record.status == BranchStatus.QUEUED:
            continue
        state = _BRANCH_FINAL[record.status]
        end = record.finished_at
        if end is None and ended is not None:
            state, end = "cancelled", ended
        note = record.error or record.session_id or ""
        spans.append(
            Span(
                stage=name, label=f"{name}.{branch}", state=state, start=record.started_at,
                end=end, note=note, branch=branch, selected=branch == fan.selected,
            )
        )  # fmt: skip
    return spans

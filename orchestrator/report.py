"""How a run is shown: a table for people, a JSON object for scripts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestrator import api
from orchestrator.models import RunRecord, StageRecord, StageStatus
from orchestrator.settings import Settings

_STYLE = {
    StageStatus.DONE: "green",
    StageStatus.RUNNING: "cyan",
    StageStatus.WAITING: "yellow",
    StageStatus.QUEUED: "blue",
    StageStatus.FAILED: "red",
    StageStatus.SKIPPED: "dim",
    StageStatus.PENDING: "dim",
}


def stage_json(record: StageRecord) -> dict[str, Any]:
    return {
        "status": record.status.value,
        "attempts": record.attempts,
        "iteration": record.iteration,
        "iterations": [i.model_dump(mode="json") for i in record.iterations],
        "requests": record.requests,
        "prompt_tokens_total": record.prompt_tokens_total,
        "prompt_tokens_max": record.prompt_tokens_max,
        "output_chars": record.output_chars,
        "duration_s": record.duration_s,
        "waiting_until": record.waiting_until,
        "rate_limit_retries": record.rate_limit_retries,
        "rate_limit_wait_s": record.rate_limit_wait_s,
        "quota_wait_s": record.quota_wait_s,
        "interrupted": record.interrupted,
        "compacted": record.compacted,
        "error": record.error,
        "artifacts": {name: ref.uri for name, ref in record.artifacts.items()},
    }


def run_json(run: RunRecord) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "status": run.status.value,
        "reason": run.reason,
        "pipeline": run.pipeline,
        "repo": run.repo,
        "commit": run.commit,
        "issue": run.issue.title,
        "current_stage": run.current_stage,
        "environment": run.environment,
        "stages": {name: stage_json(record) for name, record in run.stages.items()},
    }


@dataclass(frozen=True)
class Activity:
    """What a running stage is doing now, read from its audit entries."""

    model_calls: int
    prompt_tokens: int
    doing: str
    """`calling read_file`, `thinking`, … — the newest event of its session."""


def live_activity(run: RunRecord, tail: list[dict[str, str]]) -> dict[str, Activity]:
    """The activity of each running stage of `run`, from the newest audit entries."""
    found = {}
    for name, record in run.stages.items():
        if record.status != StageStatus.RUNNING or not record.session_id:
            continue
        mine = [e for e in tail if e.get("session") == record.session_id]
        calls = tokens = 0
        doing = "starting"
        for entry in mine:
            kind = entry.get("kind", "")
            usage = _usage(entry)
            if usage is not None:
                calls, tokens = calls + 1, tokens + usage
            doing = {
                "tool_call": f"calling {_tool_name(entry)}",
                "tool_result": "thinking",
                "user_message": "thinking",
                "model_reply": "replying",
            }.get(kind, doing)
        found[name] = Activity(calls, tokens, doing)
    return found


def _usage(entry: dict[str, str]) -> int | None:
    try:
        usage = json.loads(entry.get("data") or "{}").get("usage")
    except (ValueError, AttributeError):
        return None
    return int(usage.get("prompt_token_count") or 0) if isinstance(usage, dict) else None


def _tool_name(entry: dict[str, str]) -> str:
    try:
        parts = json.loads(entry.get("data") or "{}")["content"]["parts"]
        return ", ".join(p["function_call"]["name"] for p in parts if "function_call" in p)
    except (ValueError, KeyError, TypeError):
        return "a tool"


def runs_table(runs: list[RunRecord], *, now: float | None = None) -> Table:
    """One line per run: the newest first."""
    now = time.time() if now is None else now
    table = Table(title=f"{len(runs)} runs", title_justify="left")
    for column in ("run", "status", "pipeline", "stage", "age", "issue", "reason"):
        table.add_column(column, overflow="fold" if column in ("issue", "reason") else "ellipsis")
    for run in runs:
        table.add_row(
            run.id,
            run.status.value,
            run.pipeline,
            run.current_stage or "",
            _age(now - run.created_at),
            run.issue.title[:60],
            (run.reason or "")[:80],
        )
    return table


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def run_table(
    run: RunRecord, *, now: float | None = None, activity: dict[str, Activity] | None = None
) -> Table:
    now = time.time() if now is None else now
    title = f"run {run.id} · {run.pipeline} · {run.status.value}"
    if run.environment:
        title += f" · environment {run.environment}"
    waits = [
        f"{name} waiting: next attempt at {_clock(r.waiting_until)} "
        f"(in {max(0.0, r.waiting_until - now):.0f}s) — {r.error or ''}"
        for name, r in run.stages.items()
        if r.status == StageStatus.WAITING and r.waiting_until
    ]
    caption = "\n".join([*waits, *([run.reason] if run.reason else [])]) or None
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for column, justify in [
        ("stage", "left"),
        ("status", "left"),
        ("tries", "right"),
        ("calls", "right"),
        ("prompt tok", "right"),
        ("max req", "right"),
        ("out chars", "right"),
        ("time", "right"),
        ("note", "left"),
    ]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, record in run.stages.items():
        live = (activity or {}).get(name)
        calls = live.model_calls if live else record.requests
        tokens = live.prompt_tokens if live else record.prompt_tokens_total
        note = _note(record, now)
        table.add_row(
            _stage_label(name, record),
            f"[{_STYLE[record.status]}]{record.status.value}[/]",
            str(record.attempts),
            str(calls),
            f"{tokens:,}",
            f"{record.prompt_tokens_max:,}",
            f"{record.output_chars:,}",
            _duration(record, now),
            note or (live.doing if live else ""),
        )
    return table


def _stage_label(name: str, record: StageRecord) -> str:
    """`fix`, or `fix.2` from a looped stage's second iteration on (as its task id says)."""
    return f"{name}.{record.iteration}" if record.iteration > 1 else name


def _clock(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%H:%M:%S")


def _duration(record: StageRecord, now: float) -> str:
    if record.duration_s is not None:
        return f"{record.duration_s:.1f}s"
    if record.status == StageStatus.RUNNING and record.started_at:
        return f"{now - record.started_at:.1f}s…"
    return ""


def _note(record: StageRecord, now: float) -> str:
    if record.status == StageStatus.WAITING and record.waiting_until:
        return f"retry at {_clock(record.waiting_until)}"
    if record.status == StageStatus.RUNNING and record.waiting_until and record.waiting_until > now:
        return f"{record.error or 'waiting'} until {_clock(record.waiting_until)}"
    if record.status == StageStatus.FAILED and record.error:
        return record.error[:120]
    notes = []
    if record.rate_limit_retries:
        notes.append(f"waited {record.rate_limit_wait_s:.1f}s on {record.rate_limit_retries} x 429")
    if record.quota_wait_s:
        notes.append(f"waited {record.quota_wait_s:.1f}s for quota")
    if record.interrupted:
        notes.append(f"lost {record.interrupted}x")
    failed = [i for i in record.iterations if not i.passed]
    if failed:
        notes.append(f"iteration {failed[-1].number}: {failed[-1].reason[:80]}")
    if record.compacted:
        notes.append(f"output {record.compacted}")
    return "; ".join(notes)


def follow(
    run_id: str,
    settings: Settings,
    *,
    interval_s: float,
    timeout_s: float,
    console: Console,
    transient: bool = False,
) -> RunRecord:
    """Redraw the run's table — with what each running stage is doing — until the run reaches
    a terminal state (or the timeout)."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    with api.connect(settings) as conductor:
        store = conductor.store

        def view() -> tuple[RunRecord, Table]:
            run = store.get(run_id)
            return run, run_table(run, activity=live_activity(run, store.audit_tail(run_id)))

        run, table = view()
        with Live(table, console=console, refresh_per_second=4, transient=transient) as live:
            while not run.status.is_terminal:
                if deadline and time.monotonic() > deadline:
                    break
                time.sleep(interval_s)
                run, table = view()
                live.update(table)
    return run

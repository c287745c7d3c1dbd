"""How a run is shown: a table for people, a JSON object for scripts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.control import api
from orchestrator.control.branch_view import branch_rows, fan_in_json, progress
from orchestrator.control.plain import safe
from orchestrator.control.tables import Cell, Column, counted, fitted_table
from orchestrator.core.errors import PipelineError
from orchestrator.core.facts import Fact, measured_fields
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.models import RunRecord, RunStatus, StageRecord, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.specs import pipeline_of
from orchestrator.core.store import RunStore

_STYLE = {
    StageStatus.DONE: "green",
    StageStatus.RUNNING: "cyan",
    StageStatus.WAITING: "yellow",
    StageStatus.QUEUED: "blue",
    StageStatus.FAILED: "red",
    StageStatus.SKIPPED: "dim",
    StageStatus.PENDING: "dim",
    StageStatus.CANCELLED: "magenta",
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
        "fan_in": fan_in_json(record.fan_in) if record.fan_in is not None else None,
    }


def run_json(
    run: RunRecord, outputs: dict[str, Any] | None = None, pipeline: Pipeline | None = None
) -> dict[str, Any]:
    """The run for scripts (`status --json`, `runs --json`). Its times are epoch seconds, as a
    stage's `waiting_until` and an iteration's times are: `created_at`, `updated_at` (its last
    change) and `ended_at` (its last change once it has ended, else null). With `outputs`, the
    stages' recorded outputs, and the `pipeline` that wrote them, each stage also holds what
    Baton measured and published (`outcome`), and `published` says where the result went."""
    stages = {name: stage_json(record) for name, record in run.stages.items()}
    for name, found in outcome(run, outputs or {}, pipeline).items():
        stages[name].update(found)
    return {
        "run_id": run.id,
        "status": run.status.value,
        "reason": run.reason,
        "pipeline": run.pipeline,
        "pipeline_hash": run.pipeline_hash,
        "repo": run.repo,
        "commit": run.commit,
        "base": run.base,
        "issue": run.issue.title,
        "current_stage": run.current_stage,
        "environment": run.environment,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "ended_at": run.updated_at if run.status.is_terminal else None,
        "published": published(run, outputs or {}, pipeline),
        "stages": stages,
        "gates": {name: gate.model_dump(mode="json") for name, gate in run.gates.items()},
    }


OUTCOME_FIGURES: dict[Fact, tuple[str, ...]] = {
    Fact.TESTS_BEFORE: ("exit_code", "passed", "failed"),
    Fact.TESTS_AFTER: ("exit_code", "passed", "failed"),
    Fact.PROOF: ("passed", "reason", "fail_to_pass", "pass_to_fail"),
    Fact.PUBLISHED_BRANCH: (),
    Fact.PUBLISHED_URL: (),
}
"""The facts Baton measures (`orchestrator.core.facts`) that a run's JSON repeats, with the
figures of each it keeps (none: the value as it is): the tests before and after a change, the
verdict of its proof, where it was published. Each is found in a stage's output at the field
its schema declares for it (`Measured(Fact.X)`), under that field's name: no pipeline's field
is named here."""

PUBLICATION: dict[Fact, str] = {
    Fact.PUBLISHED_URL: "url",
    Fact.PUBLISHED_BRANCH: "branch",
    Fact.PUBLISHED_COMMIT: "commit",
}
"""The facts that say where a run's result went, by the key `published` gives each."""


def outcome(
    run: RunRecord, outputs: dict[str, Any], pipeline: Pipeline | None
) -> dict[str, dict[str, Any]]:
    """By stage, what Baton measured of its work and what it published, read from the stages'
    recorded `outputs` (`RunStore.outputs`) at the fields `pipeline`'s schemas declare for
    those facts (in the fixer, `fix`'s tests before and after and its proof, `pr`'s branch).
    A stage whose output holds none of them (or that has no output yet) is left out; so is
    every stage when the pipeline is not known (None: its schemas do not import here)."""
    found: dict[str, dict[str, Any]] = {}
    for name, output, fields in _measured(run, outputs, pipeline):
        figures = {
            field: {k: output[field].get(k) for k in kept} if kept else output[field]
            for fact, kept in OUTCOME_FIGURES.items()
            if (field := fields.get(fact)) is not None and output.get(field) is not None
        }
        if figures:
            found[name] = figures
    return found


def published(
    run: RunRecord, outputs: dict[str, Any], pipeline: Pipeline | None
) -> dict[str, Any] | None:
    """Where the run's result went — `url` (a pull request's or a posted review's page),
    `branch`, `commit`, and the `stage` that published it — as its last publishing stage
    recorded it; None if no stage has published anything."""
    where = None
    for name, output, fields in _measured(run, outputs, pipeline):
        said = {
            key: output[field]
            for fact, key in PUBLICATION.items()
            if (field := fields.get(fact)) is not None and output.get(field)
        }
        if said:
            where = {"stage": name, **{key: said.get(key) for key in PUBLICATION.values()}}
    return where


def _measured(
    run: RunRecord, outputs: dict[str, Any], pipeline: Pipeline | None
) -> Iterator[tuple[str, dict[str, Any], dict[Fact, str]]]:
    """Each stage of the run with an output (in `outputs` by its output key), in pipeline
    order, and its schema's measured fields."""
    if pipeline is None:
        return
    for spec in pipeline.stages:
        output = outputs.get(spec.output_key)
        if spec.name not in run.stages or not isinstance(output, dict):
            continue
        try:
            schema = spec.schema_class()
        except PipelineError:  # its schema does not import in this process
            continue
        yield spec.name, output, measured_fields(schema)


def recorded_outputs(store: RunStore, run: RunRecord) -> tuple[Pipeline | None, dict[str, Any]]:
    """The pipeline `run` pinned and its stages' recorded outputs, by output key; (None, {})
    when this process cannot read the pipeline (its schemas do not import here, say): what it
    measured is then not shown, and nothing else changes."""
    try:
        pipeline = pipeline_of(store, run)
    except PipelineError:
        return None, {}
    return pipeline, store.outputs(run.id, [spec.output_key for spec in pipeline.stages])


def published_line(where: dict[str, Any] | None) -> Text | None:
    """`published: https://…/pull/7 · branch baton/r · commit 0123456789ab`, or None."""
    if where is None:
        return None
    parts = [where["url"]] if where.get("url") else []
    if where.get("branch"):
        parts.append(f"branch {where['branch']}")
    if where.get("commit"):
        parts.append(f"commit {str(where['commit'])[:12]}")
    said = f"published ({where['stage']}): " + " · ".join(parts)
    return Text(safe(said), style="green")  # a host tool's URL: the tool's word


@dataclass(frozen=True)
class Activity:
    """What a running stage is doing now, read from its audit entries."""

    model_calls: int
    prompt_tokens: int
    doing: str
    """`calling read_file`, `thinking`, … — the newest event of its session."""


def live_activity(run: RunRecord, tail: list[dict[str, str]]) -> dict[str, Activity]:
    """The activity of each running stage of `run`, from the newest audit entries; a running
    branch of a fan-out stage's under `<stage>.<branch>` (`fix.b2`)."""
    found = {}
    for name, record in run.stages.items():
        if record.status == StageStatus.RUNNING and record.session_id:
            found[name] = activity_of(record.session_id, tail)
        for branch, state in (record.fan_in.branches if record.fan_in else {}).items():
            if state.status == BranchStatus.RUNNING and state.session_id:
                found[f"{name}.{branch}"] = activity_of(state.session_id, tail)
    return found


def activity_of(session_id: str, tail: list[dict[str, str]]) -> Activity:
    """What the session `session_id` did, from the audit entries `tail` (of any session)."""
    calls = tokens = 0
    doing = "starting"
    for entry in tail:
        if entry.get("session") != session_id:
            continue
        usage = _usage(entry)
        if usage is not None:
            calls, tokens = calls + 1, tokens + usage
        doing = {
            "tool_call": f"calling {_tool_name(entry)}",
            "tool_result": "thinking",
            "user_message": "thinking",
            "model_reply": "replying",
        }.get(entry.get("kind", ""), doing)
    return Activity(calls, tokens, doing)


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


def runs_table(
    runs: list[RunRecord],
    *,
    now: float | None = None,
    width: int | None = None,
    budgets: Mapping[str, str] | None = None,
) -> Table:
    """One line per run, the newest first. Within `width`, the issue and the reason shrink to
    a few characters (ending in an ellipsis) and the stage, the reason, the pipeline and the
    age give way, in that order: at 80 columns the pipeline stays. The run id and status are
    always whole, the issue and the reason on one line. With `budgets` (run id → its spend
    against its budget, `orchestrator.control.budget_view`), a `budget` column shows them; it
    gives way first."""
    now = time.time() if now is None else now
    columns = [
        Column("run"),
        Column("status"),
        Column("pipeline", drop=2),
        Column("stage", drop=4),
        Column("age", drop=1),
        Column("issue", shrink_to=11),
        Column("reason", shrink_to=8, drop=3),
    ]
    rows = [
        [run.id, run.status.value, run.pipeline, run.current_stage or "",
         _age(now - run.created_at), run.issue.title, run.reason or ""]
        for run in runs
    ]  # fmt: skip
    if budgets:
        columns.append(Column("budget", drop=5))
        rows = [[*row, budgets.get(run.id, "")] for row, run in zip(rows, runs, strict=True)]
    return fitted_table(
        columns, rows, width=width, title=counted(len(runs), "run"), title_justify="left"
    )


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def run_table(
    run: RunRecord,
    *,
    now: float | None = None,
    activity: dict[str, Activity] | None = None,
    width: int | None = None,
    where: dict[str, Any] | None = None,
) -> Table:
    """One line per stage, with the live figures of a running stage (`activity`); below it,
    the waits, a failed stage's error, why the run ended and where its result went (`where`,
    as `published` says). Within `width`, the request and
    output sizes give way first, then the tries and the prompt tokens; the note stays on one
    line."""
    now = time.time() if now is None else now
    columns = [
        Column("stage"),
        Column("status"),
        Column("tries", justify="right", drop=3),
        Column("calls", justify="right"),
        Column("prompt tok", justify="right", drop=2),
        Column("max req", justify="right", drop=5),
        Column("out chars", justify="right", drop=4),
        Column("time", justify="right"),
        Column("note", shrink_to=16),
    ]
    rows: list[list[Cell]] = []
    for name, record in run.stages.items():
        rows.append(_stage_row(run, name, record, (activity or {}).get(name), now))
        if record.fan_in is not None:
            live = {
                branch: going
                for branch in record.fan_in.branches
                if (going := (activity or {}).get(f"{name}.{branch}")) is not None
            }
            rows.extend(branch_rows(run, record.fan_in, now=now, live=live))
    title = f"run {run.id} · {run.pipeline} · {run.status.value}"
    caption, line = _caption(run, now), published_line(where)
    if line is not None:
        caption = Text("\n").join([caption, line]) if caption else line
    # The line that says where the result went stays whole, as the title does: a URL cut in
    # two is no longer one to copy.
    least = max(Text(title).cell_len, line.cell_len if line is not None else 0)
    return fitted_table(columns, rows, width=width, title=title, caption=caption,
                        title_justify="left", caption_justify="left",
                        min_width=least if width is None else min(width, least))  # fmt: skip


def _stage_row(
    run: RunRecord, name: str, record: StageRecord, live: Activity | None, now: float
) -> list[Cell]:
    return [
        _stage_label(name, record),
        _status(run, record),
        str(record.attempts),
        str(live.model_calls if live else record.requests),
        f"{live.prompt_tokens if live else record.prompt_tokens_total:,}",
        f"{record.prompt_tokens_max:,}",
        f"{record.output_chars:,}",
        _duration(record, now),
        _note(run, record, now)
        or _fan_note(record)
        or _history(record)
        or (live.doing if live else ""),
    ]


def _fan_note(record: StageRecord) -> str:
    """A fan-out stage's progress (`2/3 branches ended`, `b2 selected of 3`)."""
    return progress(record.fan_in) if record.fan_in is not None else ""


def _stage_label(name: str, record: StageRecord) -> str:
    """`fix`, or `fix.2` from a looped stage's second iteration on (as its task id says)."""
    return f"{name}.{record.iteration}" if record.iteration > 1 else name


_UNFINISHED = {StageStatus.QUEUED, StageStatus.WAITING, StageStatus.RUNNING}


def _status(run: RunRecord, record: StageRecord) -> Text:
    """The stage's status, or how its run's end left it. A cancel marks the queued and waiting
    stages cancelled, but a running one stays `running` until its worker reaches a safe point
    and stops it, after the run has ended: shown as `cancelled` meanwhile (`stopped` in a run
    that ended otherwise), as the run's last frame should say."""
    if run.status.is_terminal and record.status in _UNFINISHED:
        ended = "cancelled" if run.status == RunStatus.CANCELLED else "stopped"
        return Text(ended, style=_STYLE[StageStatus.CANCELLED])
    return Text(record.status.value, style=_STYLE[record.status])


def _caption(run: RunRecord, now: float) -> Text | None:
    """What does not fit a table cell: when waiting stages try again, a failed stage's error
    (cut: a test log can run to pages, and the table must stay on the screen), why the run
    ended (unless that is the error already said) and the environment its code ran in."""
    caption = Text()
    for name, record in run.stages.items():
        if record.status == StageStatus.WAITING and record.waiting_until:
            caption.append(
                f"{name} waiting: next attempt at {_clock(record.waiting_until)} "
                f"(in {max(0.0, record.waiting_until - now):.0f}s) — {_cut(record.error or '')}\n"
            )
    failed = {
        name: record.error
        for name, record in run.stages.items()
        if record.status == StageStatus.FAILED and record.error
    }
    for name, error in failed.items():
        label = _stage_label(name, run.stages[name])
        caption.append(f"{label} failed: {_cut(error)}\n", style=_STYLE[StageStatus.FAILED])
    if run.reason and run.reason not in {f"{name}: {error}" for name, error in failed.items()}:
        caption.append(_cut(run.reason) + "\n")
    if run.environment:
        caption.append(f"environment {run.environment}")
    caption.rstrip()
    return caption or None


def _cut(text: str, *, max_chars: int = 300, max_lines: int = 3) -> str:
    """`text` in at most `max_lines` lines and `max_chars` characters, and a marker saying how
    much was left out and where it is whole."""
    text = safe(text.strip())  # an error may quote a model, a tool or a repository
    kept = "\n".join(text.splitlines()[:max_lines])[:max_chars].rstrip()
    if kept == text:
        return text
    return f"{kept} … [{len(text) - len(kept):,} more characters; --json shows them all]"


def _clock(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%H:%M:%S")


def _duration(record: StageRecord, now: float) -> str:
    if record.duration_s is not None:
        return f"{record.duration_s:.1f}s"
    if record.status == StageStatus.RUNNING and record.started_at:
        return f"{now - record.started_at:.1f}s…"
    return ""


def _note(run: RunRecord, record: StageRecord, now: float) -> str:
    """What the stage's state says beyond its status."""
    if run.status.is_terminal and record.status in _UNFINISHED:
        return "stopping" if record.status == StageStatus.RUNNING else ""
    if record.status == StageStatus.WAITING and record.waiting_until:
        return f"retry at {_clock(record.waiting_until)}"
    if record.status == StageStatus.RUNNING and record.waiting_until and record.waiting_until > now:
        return f"{record.error or 'waiting'} until {_clock(record.waiting_until)}"
    if record.status == StageStatus.FAILED and record.error:
        return "error below"
    if record.status == StageStatus.CANCELLED and record.error:
        return record.error
    return ""


def _history(record: StageRecord) -> str:
    """What the stage went through: waits, lost executions, its last failed iteration."""
    notes = []
    if record.rate_limit_retries:
        notes.append(f"waited {record.rate_limit_wait_s:.1f}s on {record.rate_limit_retries} x 429")
    if record.quota_wait_s:
        notes.append(f"waited {record.quota_wait_s:.1f}s for quota")
    if record.interrupted:
        notes.append(f"lost {record.interrupted}x")
    failed = [i for i in record.iterations if not i.passed]
    if failed:
        notes.append(f"iteration {failed[-1].number}: {failed[-1].reason}")
    if record.compacted:
        notes.append(f"output {record.compacted}")
    return "; ".join(notes)


def run_view(store: RunStore, run_id: str, *, width: int | None = None) -> tuple[RunRecord, Table]:
    """The run as it is now, and its table with what each running stage is doing (read from
    the audit log) and where its result went: what `baton status` prints and `baton watch`
    redraws."""
    run = store.get(run_id)
    pipeline, outputs = recorded_outputs(store, run)
    where = published(run, outputs, pipeline)
    activity = live_activity(run, store.audit_tail(run_id))
    return run, run_table(run, activity=activity, width=width, where=where)


def follow(
    run_id: str,
    settings: Settings,
    *,
    interval_s: float,
    timeout_s: float,
    console: Console,
    transient: bool = False,
) -> RunRecord:
    """Redraw the run's table — with what each running stage (and branch) is doing — until
    the run reaches a terminal state, or parks awaiting a person's approval (or the
    timeout)."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    with api.connect(settings) as conductor:
        run, table = run_view(conductor.store, run_id, width=console.width)
        with Live(table, console=console, refresh_per_second=4, transient=transient) as live:
            while not (run.status.is_terminal or run.status == RunStatus.AWAITING_APPROVAL):
                if deadline and time.monotonic() > deadline:
                    break
                time.sleep(interval_s)
                run, table = run_view(conductor.store, run_id, width=console.width)
                live.update(table)
    if not console.is_terminal:
        console.line()  # rich ends the last frame with a newline only on a terminal
    return run

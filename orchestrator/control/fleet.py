"""`baton top`: the fleet at a glance — queues (and whether a worker serves each), workers and
what they run, runs by state; and, for `status` and the web UI, whether a run waits on a queue
no worker serves."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from orchestrator.control.tables import Column, counted, fitted_table
from orchestrator.core.conductor import Conductor, stage_of
from orchestrator.core.errors import PipelineError
from orchestrator.core.models import RunRecord, StageStatus
from orchestrator.core.serving import servers
from orchestrator.core.store import RunStore

RECENT_RUNS = 200
"""How many of the newest runs the run counts look at."""


@dataclass(frozen=True)
class QueueView:
    name: str
    waiting: int
    """Messages in the queue's list."""
    delivered: int
    """Delivered to a worker, not yet acknowledged (running, or an ETA retry it holds)."""
    servers: int = 0
    """Workers that announced they serve it (`orchestrator.core.serving`)."""


@dataclass(frozen=True)
class WorkerView:
    name: str
    running: list[str]
    """The task id of each stage it runs now: `<run id>.<stage>`, `<run id>.<stage>.<n>` for a
    looped stage's iteration n, `<run id>.<stage>.<branch>` for a branch (`….fix.b2`)."""


@dataclass(frozen=True)
class Fleet:
    queues: list[QueueView]
    workers: list[WorkerView]
    runs: dict[str, int] = field(default_factory=dict)
    """Runs by status, among the newest `RECENT_RUNS` and every active one."""

    def as_json(self) -> dict[str, Any]:
        return {
            "queues": {
                q.name: {"waiting": q.waiting, "delivered": q.delivered, "servers": q.servers}
                for q in self.queues
            },
            "workers": {w.name: w.running for w in self.workers},
            "runs": self.runs,
        }


def snapshot(conductor: Conductor, *, timeout_s: float = 1.0) -> Fleet:
    """Read the fleet now: queue lengths from Redis, workers by a Celery broadcast."""
    app = conductor.dispatcher.app
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        delivered: Counter[str] = Counter()
        for raw in client.hvals("unacked"):
            _, _, routing_key = json.loads(raw)
            delivered[routing_key] += 1
        names = {
            q.decode() if isinstance(q, bytes) else q
            for q in client.scan_iter(match="baton.*", _type="list")
        }
        listed = sorted(names | set(delivered))
        served = servers(conductor.store.redis, listed)
        queues = [
            QueueView(name, int(client.llen(name)), delivered[name], served[name])
            for name in listed
        ]
    replies = app.control.inspect(timeout=timeout_s).active() or {}
    workers = [
        WorkerView(name, [task.get("id", "?") for task in tasks])
        for name, tasks in sorted(replies.items())
    ]
    return Fleet(queues, workers, _run_counts(conductor))


def unserved_queue(store: RunStore, run: RunRecord) -> str | None:
    """The queue `run`'s current stage waits in, if no worker serves it (None otherwise, and
    for a run whose pinned spec cannot be read: the run says why itself)."""
    stage = run.current_stage
    if run.status.is_terminal or stage is None or stage not in run.stages:
        return None
    if run.stages[stage].status not in (StageStatus.QUEUED, StageStatus.WAITING):
        return None
    try:
        queue = stage_of(store, run, stage).queue
    except PipelineError:
        return None
    return queue if servers(store.redis, [queue])[queue] == 0 else None


def unserved_note(run: RunRecord, queue: str) -> str:
    """What to say of a run waiting on a queue no worker serves, and what to do."""
    return (
        f"no worker serves {queue}, where {run.current_stage} waits: start one with "
        f"`baton worker --pipeline {run.pipeline} --stages {run.current_stage}`"
    )


def _run_counts(conductor: Conductor) -> dict[str, int]:
    store = conductor.store
    counts: Counter[str] = Counter()
    for _, run in store.get_each(set(store.recent(limit=RECENT_RUNS)) | set(store.active())):
        if run is not None:
            counts[run.status.value] += 1
    return dict(sorted(counts.items()))


def fleet_view(fleet: Fleet, *, width: int | None = None) -> Group:
    """The queues, the workers and what they run, the runs by status: a table each, or a line
    saying there is none. Within `width`, task ids (`<run id>.<stage>`) are shown whole, one
    per line, and a long worker name gives way."""
    return Group(_queues(fleet, width), _workers(fleet, width), _runs(fleet, width))


def _queues(fleet: Fleet, width: int | None) -> RenderableType:
    if not fleet.queues:
        return Text("queues: no stage queue has work")
    columns = [
        Column("queue"),
        Column("waiting", justify="right"),
        Column("delivered", justify="right"),
        Column("workers", justify="right"),
    ]
    rows = [
        [q.name, str(q.waiting), str(q.delivered), str(q.servers) if q.servers else "none"]
        for q in fleet.queues
    ]
    unserved = [q.name for q in fleet.queues if q.waiting and not q.servers]
    caption = f"no worker serves {', '.join(unserved)}" if unserved else None
    return fitted_table(columns, rows, width=width, title="queues", title_justify="left",
                        caption=caption, caption_justify="left", caption_style="red")  # fmt: skip


def _workers(fleet: Fleet, width: int | None) -> RenderableType:
    if not fleet.workers:
        return Text("workers: none answered")
    title = counted(len(fleet.workers), "worker")
    columns = [Column("worker", shrink_to=16), Column("running")]
    rows = [[w.name, "\n".join(w.running) or "idle"] for w in fleet.workers]
    return fitted_table(columns, rows, width=width, title=title, title_justify="left")


def _runs(fleet: Fleet, width: int | None) -> RenderableType:
    if not fleet.runs:
        return Text(f"runs: none among the newest {RECENT_RUNS}")
    columns = [Column(status, justify="right") for status in fleet.runs]
    rows = [[str(n) for n in fleet.runs.values()]]
    return fitted_table(columns, rows, width=width, title="runs", title_justify="left")

"""When each task started and ended, for the overhead benchmark: Celery `task_prerun` and
`task_postrun` handlers, installed in both workers it compares, append
`<start|end> <task id> <time.time()>` to a file.

`task_prerun` fires in the pool process just before the task function is called, `task_postrun`
just after it returned: between them is the task's own work (Baton's stage, or the plain
chain's one model call).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery.signals import task_postrun, task_prerun

TRACE_FILE_ENV = "BENCH_TRACE_FILE"
"""The environment variable naming the file a worker appends to."""


def install() -> None:
    """Note every task's start and end in the file `BENCH_TRACE_FILE` names (a worker's entry
    point calls this once)."""
    path = os.environ[TRACE_FILE_ENV]

    def note(what: str, task_id: str) -> None:
        now = time.time()
        with open(path, "a") as file:
            file.write(f"{what} {task_id} {now:.6f}\n")

    def started(task_id: str, **_: Any) -> None:
        note("start", task_id)

    def ended(task_id: str, **_: Any) -> None:
        note("end", task_id)

    task_prerun.connect(started, weak=False)
    task_postrun.connect(ended, weak=False)


def read(path: Path, what: str = "start") -> dict[str, float]:
    """Task id → when the task started (`start`) or ended (`end`), from a trace file."""
    if not path.exists():
        return {}
    lines = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {task_id: float(ts) for kind, task_id, ts in lines if kind == what}


def seen(path: Path, task_id: str) -> bool:
    """Whether the task has started, by a trace file (cheaper than `read`)."""
    return path.exists() and f"start {task_id} " in path.read_text()

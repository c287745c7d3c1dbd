"""When each task started, for the overhead benchmark: a Celery `task_prerun` handler, installed
in both workers it compares, appends `<task id> <time.time()>` to a file.

`task_prerun` fires in the pool process just before the task function is called: what follows
is the task's own work (Baton's stage, or the plain chain's one model call).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery.signals import task_prerun

TRACE_FILE_ENV = "BENCH_TRACE_FILE"
"""The environment variable naming the file a worker appends to."""


def install() -> None:
    """Note every task's start in the file `BENCH_TRACE_FILE` names (a worker's entry point
    calls this once)."""
    path = os.environ[TRACE_FILE_ENV]

    def note(task_id: str, **_: Any) -> None:
        started = time.time()
        with open(path, "a") as file:
            file.write(f"{task_id} {started:.6f}\n")

    task_prerun.connect(note, weak=False)


def starts(path: Path) -> dict[str, float]:
    """Task id → when the task started, from a trace file."""
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {task_id: float(ts) for task_id, ts in pairs}

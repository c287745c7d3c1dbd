"""CPU time of a worker's processes, read from /proc: the main process and its pool."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class WorkerCpu:
    """CPU seconds (user + system, including the children each has waited for) by process."""

    main: float
    pool: dict[int, float]


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # the fields after "pid (comm)"


def cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of one process (all its threads), in seconds."""
    fields = _stat(pid)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS_PER_S


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
    return sorted(found)


def worker_cpu(main_pid: int) -> WorkerCpu:
    """A worker's CPU time so far: its main process and each pool process."""
    return WorkerCpu(cpu_s(main_pid), {pid: cpu_s(pid) for pid in children(main_pid)})


def spent(before: WorkerCpu, after: WorkerCpu) -> tuple[float, float]:
    """(main, pool) CPU seconds spent between two readings of the same worker.

    Raises:
        RuntimeError: a pool process was replaced in between (its time would be lost).
    """
    if set(before.pool) != set(after.pool):
        raise RuntimeError(f"the pool changed: {sorted(before.pool)} → {sorted(after.pool)}")
    pool = sum(after.pool[pid] - before.pool[pid] for pid in before.pool)
    return after.main - before.main, pool

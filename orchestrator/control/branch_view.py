"""How a fan-out stage's branches are shown: a sub-row per branch under the stage in `baton
status` and `baton watch`, the same in `status --json`, and a line of progress.

A branch's record is the run's own (`orchestrator.core.fanin.BranchRecord`): its status, its
executions, the session id of its latest one (`<run>:<stage>:<branch>:<attempt>`) and the
facts selection read. The branch the fan-in selected is marked `★`; its output is the stage's.
A branch's error may quote a model or a repository: every cell goes through
`orchestrator.control.plain.safe` (the table does it for a plain string).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.text import Text

from orchestrator.control.tables import Cell
from orchestrator.core.branches import branch_number
from orchestrator.core.fanin import BranchRecord, BranchStatus, FanIn
from orchestrator.core.models import RunRecord

if TYPE_CHECKING:
    from orchestrator.control.inspection import Entry

SELECTED = "★"
"""The mark beside the branch whose output became the stage's."""

STYLE = {
    BranchStatus.QUEUED: "blue",
    BranchStatus.RUNNING: "cyan",
    BranchStatus.DONE: "green",
    BranchStatus.FAILED: "red",
}


def ordered(fan: FanIn) -> list[tuple[str, BranchRecord]]:
    """The branches in branch order (`b2` before `b10`)."""
    return [(name, fan.branches[name]) for name in sorted(fan.branches, key=branch_number)]


def fan_in_json(fan: FanIn) -> dict[str, Any]:
    """A stage's branches for scripts (`status --json`): each with its status, attempts,
    session id and whether it is `selected`, in branch order; the count ended; the join."""
    return {
        "branches": {
            name: {**record.model_dump(mode="json"), "selected": name == fan.selected}
            for name, record in ordered(fan)
        },
        "ended": fan.ended,
        "joined": fan.joined,
        "selected": fan.selected,
    }


def progress(fan: FanIn) -> str:
    """`2/3 branches ended (1 failed)` while they run; `b2 selected of 3` once joined."""
    failed = sum(1 for _, record in ordered(fan) if record.status == BranchStatus.FAILED)
    total = len(fan.branches)
    if fan.joined:
        if fan.selected is None:
            return f"none of {total} branches selected"
        return f"{fan.selected} selected of {total}"
    said = f"{fan.ended}/{total} branches ended"
    return said + (f" ({failed} failed)" if failed else "")


def branch_rows(
    run: RunRecord, fan: FanIn, *, now: float | None = None, calls: dict[str, int] | None = None
) -> list[list[Cell]]:
    """A sub-row per branch, under its stage's row of `report.run_table` and in its columns
    (stage, status, tries, calls, prompt tok, max req, out chars, time, note): `└ b2 ★`,
    its status, its executions, its model calls (`calls`, by branch, for one still running:
    counted from the audit log), its tokens and output, its time, and in the note its session
    id, or why it failed."""
    now = time.time() if now is None else now
    branches = ordered(fan)
    rows: list[list[Cell]] = []
    for index, (name, record) in enumerate(branches):
        corner = "└" if index == len(branches) - 1 else "├"
        mark = f" {SELECTED}" if name == fan.selected else ""
        live = (calls or {}).get(name)
        rows.append([
            f"  {corner} {name}{mark}",
            _status(run, record),
            str(record.attempts),
            str(live if live is not None else record.requests),
            f"{record.prompt_tokens_total:,}",
            "",
            f"{record.output_chars:,}",
            _duration(record, now),
            _note(record),
        ])  # fmt: skip
    return rows


def _status(run: RunRecord, record: BranchRecord) -> Text:
    """The branch's status; one left unfinished by a run that ended is shown `stopped`."""
    if run.status.is_terminal and not record.status.ended:
        return Text("stopped", style="magenta")
    return Text(record.status.value, style=STYLE[record.status])


def _duration(record: BranchRecord, now: float) -> str:
    if record.started_at is None:
        return ""
    if record.finished_at is not None:
        return f"{record.finished_at - record.started_at:.1f}s"
    return f"{now - record.started_at:.1f}s…" if record.status == BranchStatus.RUNNING else ""


def _note(record: BranchRecord) -> str:
    """Why it failed, else its session id (and its lost executions)."""
    if record.status == BranchStatus.FAILED and record.error:
        return " ".join(record.error.split())
    parts = [record.session_id or ""]
    if record.interrupted:
        parts.append(f"lost {record.interrupted}x")
    if record.proof_passed is not None:
        parts.append("proof passed" if record.proof_passed else "proof failed")
    return " · ".join(part for part in parts if part)


RUN_LEVEL = "(run)"
"""The group of audit entries about the whole run, which carry no branch label."""


def group_by_branch(entries: Sequence[Entry]) -> dict[str, list[Entry]]:
    """The entries by branch label (`fixer.search`, `fixer.fix.b1`, …), each group in its
    own order, the groups in the order their first entries came: `baton log --by-branch`."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.branch or RUN_LEVEL, []).append(entry)
    return groups

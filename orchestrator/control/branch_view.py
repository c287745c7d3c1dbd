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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

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
    BranchStatus.WAITING: "yellow",
    BranchStatus.AWAITING_APPROVAL: "magenta",
    BranchStatus.DONE: "green",
    BranchStatus.FAILED: "red",
    BranchStatus.CANCELLED: "dim",
}
"""How each status is drawn: every status has one (a test walks them all)."""


class Live(Protocol):
    """What a running branch's session is doing, read from the audit log
    (`orchestrator.control.report.Activity`)."""

    @property
    def model_calls(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def doing(self) -> str: ...


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
    run: RunRecord, fan: FanIn, *, now: float | None = None, live: Mapping[str, Live] | None = None
) -> list[list[Cell]]:
    """A sub-row per branch, under its stage's row of `report.run_table` and in its columns
    (stage, status, tries, calls, prompt tok, max req, out chars, time, note): `└ b2 ★`,
    its status, its executions, its model calls and prompt tokens (for one still running, as
    `live` has them by branch, from the audit log), its output, its time, and in the note its
    session (`…:fix:b2:1`) and what it is doing, or why it failed."""
    now = time.time() if now is None else now
    branches = ordered(fan)
    rows: list[list[Cell]] = []
    for index, (name, record) in enumerate(branches):
        corner = "└" if index == len(branches) - 1 else "├"
        mark = f" {SELECTED}" if name == fan.selected else ""
        going = (live or {}).get(name)
        rows.append([
            f"  {corner} {name}{mark}",
            _status(run, record),
            str(record.attempts),
            str(going.model_calls if going else record.requests),
            f"{going.prompt_tokens if going else record.prompt_tokens_total:,}",
            "",
            f"{record.output_chars:,}",
            _duration(record, now),
            " · ".join(n for n in (_note(run.id, record), going.doing if going else "") if n),
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


def _note(run_id: str, record: BranchRecord) -> str:
    """Why it failed, else its session id (`…:fix:b2:1`: the run id, which the table's title
    holds, left out, so that what tells the sessions apart fits a narrow terminal; `--json`
    has it whole), its lost executions and its proof."""
    if record.status == BranchStatus.FAILED and record.error:
        return " ".join(record.error.split())
    session = record.session_id or ""
    parts = ["…" + session.removeprefix(run_id) if session.startswith(f"{run_id}:") else session]
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

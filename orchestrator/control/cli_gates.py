"""`baton approve` and `baton reject`: a person's decision on a run's gate
(`orchestrator.core.gates`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.control import api
from orchestrator.control.plain import safe
from orchestrator.core import gates
from orchestrator.core.models import GateStatus, RunRecord

EXIT_NOT_APPLIED = 1
"""What `reject` exits with when the gate had been rejected before (nothing changed)."""


@click.command()
@click.argument("run_id")
@click.option("--gate", "gate", metavar="ID", help="The gate (default: the run's one pending "
              "gate; `baton status` lists them).")  # fmt: skip
@click.option("--edit", "edit", type=click.Path(dir_okay=False, path_type=Path),
              help="A JSON file that replaces the gated stage's output (a plan's): it must fit "
              "the stage's schema, and every later stage reads it.")  # fmt: skip
def approve(run_id: str, gate: str | None, edit: Path | None) -> None:
    """Approve a run awaiting approval so that it goes on; approving again changes nothing."""
    approval = api.approve(run_id, gate=gate, edit=edit)
    run = api.get_run(run_id)
    if approval.applied:
        then = f"{approval.queued} queued" if approval.queued else f"the run is {run.status}"
        click.echo(f"run {run_id} approved; {then}")
        return
    decided = run.gates[gates.choose(run, gate)]
    click.echo(f"run {run_id}: gate already approved by {decided.decided_by}; nothing changed "
               f"(the run is {run.status})")  # fmt: skip


@click.command()
@click.argument("run_id")
@click.option("--gate", "gate", metavar="ID", help="The gate (default: the run's one pending "
              "gate).")  # fmt: skip
@click.option("--reason", required=True, help="Why: the run's reason, kept in its audit log.")
def reject(run_id: str, gate: str | None, reason: str) -> None:
    """Reject a run awaiting approval: the run ends `rejected` with the reason."""
    if api.reject(run_id, gate=gate, reason=reason):
        click.echo(f"run {run_id} rejected: {reason}")
    else:
        click.echo(f"run {run_id}: gate already rejected, nothing changed", err=True)
        sys.exit(EXIT_NOT_APPLIED)


def gate_notes(run: RunRecord) -> list[str]:
    """What `baton status` says of a run's gates that wait for a person."""
    notes = []
    for name, gate in gates.pending(run).items():
        what = "its output" if gate.approve == "plan" else "its diff and proof"
        escalated = " (past its timeout: escalated)" if gate.escalated_at else ""
        notes.append(
            f"gate {name} awaits approval of stage {gate.stage}'s {gate.approve}{escalated}: "
            f"see {what} with `baton show {run.id} --stage {gate.stage}`; then "
            f"`baton approve {run.id} --gate {name} [--edit FILE]` or "
            f"`baton reject {run.id} --gate {name} --reason TEXT`"
        )
    for name, gate in run.gates.items():
        if gate.status == GateStatus.REJECTED:
            notes.append(f"gate {name} was rejected by {gate.decided_by}: {gate.reason}")
    return [safe(note) for note in notes]  # a reason is typed by a person, through the API too

"""`baton approve`, `baton reject` and what `baton status` says of a gate, against a real
Redis."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.control.cli import main
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import RunStatus

from .test_gates_conductor import EDITED, conductor, parked

__all__ = ["conductor"]  # the fixture, for the tests here


def baton(redis_url: str, *args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, list(args), env={"BATON_REDIS_URL": redis_url})
    return done.exit_code, done.output


def test_status_names_the_pending_gate_and_approve_applies_the_edit_once(
    conductor: Conductor, unit_redis_url: str, tmp_path: Path
) -> None:
    run_id = parked(conductor)
    edit = tmp_path / "plan.json"
    edit.write_text(json.dumps(EDITED))

    code, said = baton(unit_redis_url, "status", run_id)
    assert code == 0
    assert "gate plan awaits approval of stage plan's plan" in " ".join(said.split())

    assert baton(unit_redis_url, "approve", run_id, "--edit", str(edit)) == (
        0, f"run {run_id} approved; act queued\n",
    )  # fmt: skip
    code, said = baton(unit_redis_url, "approve", run_id)
    assert (code, said.split(";")[0]) == (
        0,
        f"run {run_id}: gate already approved by {getpass.getuser()}",
    )
    assert conductor.store.output(run_id, "plan") == EDITED


def test_reject_ends_the_run_with_the_reason(conductor: Conductor, unit_redis_url: str) -> None:
    run_id = parked(conductor)

    assert baton(unit_redis_url, "reject", run_id, "--reason", "wrong file") == (
        0, f"run {run_id} rejected: wrong file\n",
    )  # fmt: skip
    code, said = baton(unit_redis_url, "approve", run_id)
    assert code == 2
    assert "was rejected (wrong file); it cannot be approved now" in " ".join(said.split())
    assert conductor.store.get(run_id).status == RunStatus.REJECTED


@pytest.mark.parametrize(
    ("content", "fault"),
    [("{not json", "the edit must be a JSON object"), ('{"plan": 1}', "summary: Field required")],
)
def test_a_bad_edit_is_refused_naming_what_is_wrong(
    conductor: Conductor, unit_redis_url: str, tmp_path: Path, content: str, fault: str
) -> None:
    run_id = parked(conductor)
    edit = tmp_path / "plan.json"
    edit.write_text(content)

    code, said = baton(unit_redis_url, "approve", run_id, "--edit", str(edit))

    assert code == 2 and fault in " ".join(said.split())
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL

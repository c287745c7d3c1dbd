"""`baton watch` ends when its run parks at a gate, saying how to approve or reject it, with
its own exit status; `baton log --by-branch` groups a fan-out's entries (against a real
Redis)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from orchestrator.control.cli import EXIT_FAILED_RUN, main
from orchestrator.control.messages import EXIT_AWAITING_APPROVAL, EXIT_BAD_INPUT, EXIT_UNREACHABLE
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import RunStatus

from .test_gates_conductor import conductor, parked

__all__ = ["conductor"]  # the fixture, for the tests here


def test_watch_exits_with_its_own_status_and_the_commands_once_the_run_awaits_approval(
    conductor: Conductor, unit_redis_url: str
) -> None:
    run_id = parked(conductor)
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL

    watch = ["watch", run_id, "--interval", "0.05", "--timeout", "20"]
    env = {"BATON_REDIS_URL": unit_redis_url}
    done = CliRunner().invoke(main, watch, env=env, terminal_width=300)

    said = " ".join(done.output.split())
    assert done.exit_code == EXIT_AWAITING_APPROVAL, done.output
    assert f"run {run_id} awaits approval; the watch ends here" in said
    assert f"baton approve {run_id} --gate plan [--edit FILE]" in said
    assert f"baton reject {run_id} --gate plan --reason TEXT" in said


def test_the_awaiting_approval_status_is_distinct_from_every_other_exit_status() -> None:
    others = {0, EXIT_FAILED_RUN, EXIT_BAD_INPUT, EXIT_UNREACHABLE}
    assert EXIT_AWAITING_APPROVAL not in others


def test_log_by_branch_prints_each_branch_s_entries_under_its_label(
    conductor: Conductor, unit_redis_url: str
) -> None:
    run_id = parked(conductor)
    said = [("b2", "second"), ("b1", "first"), ("b2", "second again")]
    conductor.store.audit(run_id, [
        {"ts": repr(100.0 + n), "branch": f"gated.fix.{branch}", "kind": "model_reply",
         "session": f"{run_id}:fix:{branch}:1",
         "data": {"content": {"parts": [{"text": text}]}}}
        for n, (branch, text) in enumerate(said)
    ])  # fmt: skip
    env = {"BATON_REDIS_URL": unit_redis_url}

    done = CliRunner().invoke(main, ["log", run_id, "--by-branch"], env=env, terminal_width=200)
    as_json = CliRunner().invoke(main, ["log", run_id, "--by-branch", "--json", "--stage", "fix"],
                                 env=env)  # fmt: skip

    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    b2, b1 = lines.index("── gated.fix.b2 · 2 entries"), lines.index("── gated.fix.b1 · 1 entry")
    assert b2 < b1 and "second again" in lines[b2 + 2] and "first" in lines[b1 + 1]
    entries = [json.loads(line) for line in as_json.output.splitlines()]
    assert [(e["branch"], e["stage"], e["attempt"]) for e in entries] == [
        ("gated.fix.b2", "fix", 1), ("gated.fix.b2", "fix", 1), ("gated.fix.b1", "fix", 1),
    ]  # fmt: skip


def test_log_by_branch_does_not_follow(unit_redis_url: str) -> None:
    done = CliRunner().invoke(main, ["log", "r", "--by-branch", "--follow"],
                              env={"BATON_REDIS_URL": unit_redis_url})  # fmt: skip
    assert done.exit_code == 2 and "--by-branch groups a whole log" in done.output

"""`baton show`, `diff`, `artifacts`, `artifact` and `log` as a user runs them — subprocesses in
an 80-column terminal — on a real demo run: the session worker fixes the bundled Sentry event
through the fake Gemini server. What they print is checked against the run store, read here
directly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from demo import SENTRY_EVENT
from orchestrator.control.inspection import find_artifact
from orchestrator.core import keys
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.store import RunStore

from .conftest import Stack

STAGES = ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]


def baton(stack: Stack, *args: str, columns: int = 80) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "BATON_REDIS_URL": stack.settings.require_redis_url(),
           "COLUMNS": str(columns), "TERM": "dumb"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", *args], env=env, capture_output=True,
        timeout=60,
    )  # fmt: skip
    return done


def lines_of(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().splitlines()


def test_show_renders_every_output_and_one_stage_alone(
    session_stack: Stack, demo_run: RunRecord, run_store: RunStore
) -> None:
    lines = lines_of(baton(session_stack, "show", demo_run.id))
    assert all(len(line) <= 80 for line in lines)
    assert lines[0] == f"run {demo_run.id} · fixer · done"
    titles = [m.group(1) for line in lines if (m := re.match(r"╭─ (\S+) ─", line))]
    # The fix loop's one iteration (fix.1) is the fix's own output: shown once, not twice.
    assert titles == ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]

    fix = run_store.output(demo_run.id, "fix")
    assert fix is not None
    iteration = "\n".join(lines_of(baton(session_stack, "show", demo_run.id, "--stage", "fix.1")))
    assert "╭─ fix.1" in iteration and fix["files_changed"][0] in iteration
    one = "\n".join(lines_of(baton(session_stack, "show", demo_run.id, "--stage", "fix")))
    assert "╭─ triage" not in one
    assert fix["files_changed"][0] in one
    assert re.search(r"passed\s+True", one)  # the proof's verdict, a nested field

    shown = json.loads(baton(session_stack, "show", demo_run.id, "--json").stdout)
    assert shown["outputs"]["fix"] == fix
    assert shown["run"]["run_id"] == demo_run.id


def test_diff_is_the_published_change_plain_when_piped(
    session_stack: Stack, demo_run: RunRecord, run_store: RunStore
) -> None:
    published = run_store.artifact(find_artifact(demo_run, "pr/workspace.diff"))
    done = baton(session_stack, "diff", demo_run.id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == published  # byte for byte: no colour codes in a pipe
    as_json = json.loads(baton(session_stack, "diff", demo_run.id, "--json").stdout)
    assert as_json["artifact"] == "pr/workspace.diff"
    assert as_json["diff"].encode() == published


def test_artifacts_list_whole_names_and_artifact_gives_the_bytes(
    session_stack: Stack, demo_run: RunRecord, run_store: RunStore, tmp_path: Path
) -> None:
    expected = [
        ref.name for record in demo_run.stages.values() for ref in record.artifacts.values()
    ]
    lines = lines_of(baton(session_stack, "artifacts", demo_run.id))
    assert all(len(line) <= 80 for line in lines)
    assert demo_run.id in lines[0]
    listed = [cells[1].strip() for line in lines if len(cells := line.split("│")) > 2]
    assert listed == expected
    assert "fix/tests-after.log" in expected

    stored = run_store.artifact(find_artifact(demo_run, "fix/tests-after.log"))
    assert baton(session_stack, "artifact", demo_run.id, "tests-after.log").stdout == stored
    target = tmp_path / "after.log"
    done = baton(session_stack, "artifact", demo_run.id, "fix/tests-after.log", "-o", str(target))
    assert done.returncode == 0
    assert target.read_bytes() == stored
    assert not target.with_name("after.log.part").exists()

    ambiguous = baton(session_stack, "artifact", demo_run.id, "workspace.diff")
    assert ambiguous.returncode == 2
    assert b"stages have an artifact 'workspace.diff'" in ambiguous.stderr
    missing = baton(session_stack, "artifact", demo_run.id, "nope.log")
    assert missing.returncode == 2
    assert b"has no artifact 'nope.log'" in missing.stderr
    unknown = baton(session_stack, "show", "20990101-000000-000000")
    assert unknown.returncode == 2
    assert b"no run with id '20990101-000000-000000'" in unknown.stderr


def test_log_is_the_audit_as_a_transcript_in_order(
    session_stack: Stack, demo_run: RunRecord, run_store: RunStore
) -> None:
    audit = run_store.redis.xrange(keys.audit(demo_run.id))
    calls = [
        part["function_call"]["name"]
        for _, entry in audit
        if entry.get("session") == f"{demo_run.id}:search:1" and entry["kind"] == "tool_call"
        for part in json.loads(entry["data"])["content"]["parts"]
        if "function_call" in part
    ]
    assert len(calls) >= 2
    lines = lines_of(baton(session_stack, "log", demo_run.id, "--stage", "search"))
    assert all(len(line) <= 80 for line in lines)
    assert all(" fixer.search " in line for line in lines)
    shown = [m.group(1) for line in lines if (m := re.search(r"\] call (\w+)\(", line))]
    assert shown == calls

    every = [
        json.loads(line) for line in lines_of(baton(session_stack, "log", demo_run.id, "--json"))
    ]
    assert [e["id"] for e in every] == [entry_id for entry_id, _ in audit]
    assert [e["kind"] for e in every][-1] == "stage_done"
    assert {e["stage"] for e in every} == set(STAGES)


def test_log_follow_prints_a_running_run_to_its_end(
    session_stack: Stack, run_store: RunStore
) -> None:
    run_id = session_stack.enqueue(SENTRY_EVENT.read_bytes(), session_stack.sample_repo())
    done = baton(session_stack, "log", run_id, "--follow", "--json")
    assert done.returncode == 0, done.stderr
    followed = [json.loads(line)["id"] for line in done.stdout.decode().splitlines()]
    assert run_store.get(run_id).status == RunStatus.DONE
    assert followed == [entry_id for entry_id, _ in run_store.redis.xrange(keys.audit(run_id))]

"""Tools of one's own, end to end: a pipeline written outside Baton's package (`tests.labeller`:
its spec, schemas module, host tools and a stdio MCP server in a temporary folder on
`PYTHONPATH`) runs to `done` on a real Celery worker, its command tools in a Docker sandbox,
the fake Gemini scripting every call through the real client."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.models import RunStatus
from orchestrator.core.store import RunStore
from testkit import services
from testkit.services import worker_env
from tests.containers import sandboxes
from tests.labeller import (
    INJECTIONS,
    LABEL,
    LABELLER_SCRIPT,
    QUEUE,
    SECRET,
    SECRET_VARIABLE,
    TOOL_CALLS,
    write_labeller,
)

from .conftest import Stack


@dataclass
class Labeller:
    spec: Path
    worker_log: Path


@pytest.fixture
def labeller(stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Labeller]:
    """The labeller pipeline in a folder of its own, on this process's path (the enqueue checks
    its tools) and the worker's, which serves its queue with the owners token in its
    environment; code stages in the plain sandbox image (no environment build)."""
    kit = tmp_path / "kit"
    spec = write_labeller(kit)
    monkeypatch.syspath_prepend(str(kit))
    path = os.pathsep.join(filter(None, [str(kit), os.environ.get("PYTHONPATH")]))
    env = {**worker_env(stack.settings), "PYTHONPATH": path, SECRET_VARIABLE: SECRET,
           "BATON_BUILD__ENABLED": "false"}  # fmt: skip
    log = tmp_path / "worker.log"
    stack.fake.set_scenario({"agents": LABELLER_SCRIPT})
    with services.worker(env, [QUEUE], logfile=log, name="labeller-worker"):
        yield Labeller(spec, log)


def tool_results(entries: list[dict[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """Each tool's name and the response its model read, from the run's audit log."""
    found = []
    for entry in entries:
        if entry["kind"] == "tool_result":
            for part in json.loads(entry["data"])["content"]["parts"]:
                found.append(
                    (part["function_response"]["name"], part["function_response"]["response"])
                )
    return found


def test_a_pipeline_of_one_s_own_runs_its_host_command_and_mcp_tools_to_done(
    stack: Stack, labeller: Labeller, run_store: RunStore
) -> None:
    run_id = stack.enqueue("Checkout fails on an empty cart", stack.sample_repo(),
                           pipeline=str(labeller.spec))  # fmt: skip
    run = stack.wait(run_id, timeout_s=120)

    assert run.status == RunStatus.DONE, run.reason
    assert run_store.output(run.id, "label") == LABEL
    audit = run_store.audit_log(run.id)
    calls = [
        part["function_call"]["name"]
        for entry in audit
        if entry["kind"] == "tool_call"
        for part in json.loads(entry["data"])["content"]["parts"]
    ]
    assert calls == TOOL_CALLS
    results = tool_results(audit)
    assert [name for name, _ in results] == TOOL_CALLS
    # the host tool that raised reached the model as an error, and the run went on
    assert results[1][1] == {
        "error": "service_status failed: ConnectionError: status service unreachable with "
        f"token [secret {SECRET_VARIABLE}]"
    }
    assert results[0][1]["auth"] == f"Bearer [secret {SECRET_VARIABLE}]"
    assert results[6][1]["content"][0]["text"] == "note on payments: refunds are owned by payments"
    assert results[7][1] == {"result": "A one-line summary."}  # its model call went through Baton
    assert [e["agent"] for e in stack.requests()] == ["label", "label", "label", "default", "label"]
    assert run.stages["label"].requests == 5
    assert sandboxes(run.id) == []

    # shell syntax in the sandbox tools' arguments ran nothing
    grep, injected, tmp, workspace = (r for name, r in results if name in ("grep_repo", "list_dir"))
    assert (grep["exit_code"], grep["output"]) == (1, "")
    assert injected["exit_code"] == 2 and f"'{INJECTIONS[1]}'" in injected["output"]
    assert tmp["exit_code"] == 0 and workspace["exit_code"] == 0
    listed = set(tmp["output"].split()) | set(workspace["output"].split())
    assert {".", "..", "shopcart"} <= listed
    assert not {"x", "y", "z"} & listed

    # the owners token is in no model request, audit entry, artifact, output or log line
    assert SECRET not in json.dumps(stack.requests())
    assert SECRET not in json.dumps(audit)
    artifacts = run.stages["label"].artifacts.values()
    assert all(SECRET.encode() not in run_store.artifact(ref) for ref in artifacts)
    assert SECRET not in run.model_dump_json()
    assert SECRET not in labeller.worker_log.read_text()
    assert (
        "host tool service_status of label raised ConnectionError"
        in labeller.worker_log.read_text()
    )

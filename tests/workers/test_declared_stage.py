"""A stage of a pipeline written outside Baton (`tests.labeller`) with a host tool, sandbox
command tools and an MCP server's tool, run by `execute_stage` with no Redis or Docker: the
real google-genai client against the in-process fake, a working copy for a sandbox, the MCP
server a real subprocess."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from demo.runner import make_sample_repo
from orchestrator.core.git import resolve_commit
from orchestrator.core.pipeline import ISSUE_KEY, load_pipeline
from testkit.inprocess import InProcessGemini
from testkit.sandboxes import LocalSandboxes
from testkit.sinks import MemoryArtifacts
from tests.labeller import (
    INJECTIONS,
    LABEL,
    LABELLER_SCRIPT,
    SECRET,
    SECRET_VARIABLE,
    TOOL_CALLS,
    write_labeller,
)
from workers.inputs import StageInputs
from workers.stage import StageSinks, execute_stage


class Ran:
    """What one execution of the labeller's stage left: output, audit, requests, usage."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        kit = tmp_path / "kit"
        spec = write_labeller(kit)
        monkeypatch.syspath_prepend(str(kit))
        pipeline = load_pipeline(str(spec))
        remote = make_sample_repo(tmp_path / "shopcart.git")
        stage = pipeline.stage("label")
        inputs = StageInputs(
            run_id="r1", pipeline=pipeline.name, spec=stage, attempt=1, repo=str(remote),
            commit=resolve_commit(str(remote)), state={ISSUE_KEY: "Title: checkout fails"},
            tools={name: pipeline.tools[name] for name in stage.tools},
        )  # fmt: skip
        self.fake = InProcessGemini({"agents": LABELLER_SCRIPT})
        self.artifacts = MemoryArtifacts(run_id="r1")
        self.audit: list[dict[str, Any]] = []
        self.sinks = StageSinks(artifacts=self.artifacts, audit=self.audit.extend, requests=[])
        self.sandboxes = LocalSandboxes(tmp_path / "sandbox-cache")
        self.output = asyncio.run(
            execute_stage(
                inputs, model=self.fake.model(transient_attempts=1), sinks=self.sinks,
                sandboxes=self.sandboxes, environ={SECRET_VARIABLE: SECRET, "HOME": "/root"},
            )
        ).output  # fmt: skip

    def results(self) -> list[tuple[str, dict[str, Any]]]:
        """Each tool's name and the response the model read, in the order of the calls."""
        found = []
        for entry in self.audit:
            if entry["kind"] == "tool_result":
                for part in json.loads(entry["data"])["content"]["parts"]:
                    response = part["function_response"]
                    found.append((response["name"], response["response"]))
        return found


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield Ran(tmp_path_factory.mktemp("labeller"), monkeypatch)


def test_a_stage_calls_host_command_and_mcp_tools_and_returns_its_output(ran: Ran) -> None:
    assert ran.output == LABEL
    calls = [
        json.loads(e["data"])["content"]["parts"] for e in ran.audit if e["kind"] == "tool_call"
    ]
    assert [p["function_call"]["name"] for parts in calls for p in parts] == TOOL_CALLS
    assert [name for name, _ in ran.results()] == TOOL_CALLS
    results = dict(ran.results())
    assert (
        results["get_note"]["content"][0]["text"]
        == "note on payments: refunds are owned by payments"
    )
    assert results["summarize"] == {"result": "A one-line summary."}
    assert len(ran.sandboxes.requests) == 1  # the command tools' sandbox


def test_the_model_is_offered_only_what_it_fills(ran: Ran) -> None:
    first = ran.fake.requests()[0]["request"]
    declared = {d["name"]: d for tool in first["tools"] for d in tool["functionDeclarations"]}

    assert sorted(declared) == sorted(
        ["lookup_owner", "service_status", "summarize", "grep_repo", "list_dir", "get_note"]
    )
    assert list(declared["lookup_owner"]["parameters_json_schema"]["properties"]) == ["path"]
    assert declared["service_status"]["parameters_json_schema"]["required"] == ["service"]
    assert list(declared["summarize"]["parameters_json_schema"]["properties"]) == ["text"]
    assert list(declared["list_dir"]["parameters_json_schema"]["properties"]) == ["path", "who"]
    assert declared["lookup_owner"]["description"].startswith("The team that owns a file")


def test_a_host_tool_that_raises_is_an_error_the_model_reads_without_its_secret(ran: Ran) -> None:
    results = ran.results()

    assert results[1] == ("service_status", {
        "error": "service_status failed: ConnectionError: status service unreachable with "
        f"token [secret {SECRET_VARIABLE}]"
    })  # fmt: skip
    assert results[0][1]["auth"] == f"Bearer [secret {SECRET_VARIABLE}]"
    assert results[0][1]["owner"] == "payments@eu"  # the declared setting reached it


def test_the_secret_is_in_no_request_audit_entry_or_artifact(ran: Ran) -> None:
    assert SECRET not in json.dumps(ran.fake.requests())
    assert SECRET not in json.dumps(ran.audit)
    assert SECRET not in json.dumps(ran.sinks.requests)
    assert all(SECRET.encode() not in data for data in ran.artifacts.data.values())


def test_shell_syntax_in_a_command_tool_argument_is_one_argument(ran: Ran) -> None:
    results = [response for name, response in ran.results() if name in ("grep_repo", "list_dir")]

    grep, listed, tmp, workspace = results
    assert (grep["exit_code"], grep["output"]) == (1, "")  # grep found no such text
    assert listed["exit_code"] == 2
    assert f"cannot access '{INJECTIONS[1]}'" in listed["output"]
    assert tmp["exit_code"] == 0 and workspace["exit_code"] == 0
    assert "shopcart" in workspace["output"].split()
    assert not {"x", "y", "z", "pwned"} & set(workspace["output"].split())


def test_a_tool_s_model_call_counts_in_the_stage_and_is_audited(ran: Ran) -> None:
    agents = [entry["agent"] for entry in ran.fake.requests()]

    assert agents == ["label", "label", "label", "default", "label"]
    assert ran.sinks.usage.requests == 5
    assert ran.sinks.usage.prompt_tokens_total == sum(
        e["prompt_tokens"] for e in ran.fake.requests()
    )
    sent = ran.fake.requests()[3]["request"]
    assert sent["contents"][0]["parts"][0]["text"] == (
        "Summarize in one line: cart.py fails on an empty cart"
    )
    entries = [(e["kind"], e["author"]) for e in ran.audit if e["author"] == "summarize"]
    assert entries == [("tool_model_request", "summarize"), ("model_reply", "summarize")]
    assert [r["agent"] for r in ran.sinks.requests or []][3] == "summarize"

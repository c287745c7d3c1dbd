"""A whole fixer run over Celery and Redis, checked from the fake server's request log."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent, SequentialAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types
from pydantic import SecretStr

from demo import SAMPLE_REPO, SENTRY_EVENT
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import ModelConfig, RetryConfig
from orchestrator.core.store import RunStore
from testkit.leaks import find_leaks, scripted_calls, traffic_lines
from testkit.sinks import MemoryArtifacts
from testkit.workspace import LocalWorkspace
from tests.repos import Git
from workers.gemini import build_model, close_model
from workers.tools.code import DIFF_ARTIFACT, build_tools

from .conftest import CANARY_KEY, Stack, demo_scenario

STAGES = ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]


def test_the_sample_issue_runs_every_stage_and_pushes_the_fix(stack: Stack, git: Git) -> None:
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.DONE, run.reason
    assert [run.stages[s].status for s in STAGES] == [StageStatus.DONE] * 7
    branch = f"baton/{run.id}"
    changed = git("diff", "--numstat", f"main..{branch}", cwd=repo).splitlines()
    assert changed == ["4\t1\tshopcart/cart.py", "15\t0\ttests/test_empty_cart_checkout.py"]


def stage_requests(stack: Stack, stages: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {stage: [e["request"] for e in stack.requests(stage)] for stage in stages}


def test_no_stage_sees_another_stages_instruction_or_tool_traffic(
    stack: Stack, run_store: RunStore
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status == RunStatus.DONE, run.reason
    requests = stage_requests(stack, STAGES)
    pipeline = load_pipeline("fixer")
    scenario = demo_scenario()
    issue = run.issue.digest()  # every stage may know the issue, which the run started from
    allowed = {  # what a stage may hold whatever its origin: the outputs it reads, the issue
        stage: json.dumps(run_store.outputs(run.id, pipeline.stage(stage).inputs)) + issue
        for stage in STAGES
    }
    change = run_store.artifact(run.stages["fix"].artifacts[DIFF_ARTIFACT]).decode()
    allowed["review"] += change  # `{change}`: the change the run made, never how it was made
    own_calls = {stage: scripted_calls(scenario, stage) for stage in STAGES}
    instructions = {stage: pipeline.stage(stage).instruction for stage in STAGES}

    leaks = find_leaks(requests, own_calls=own_calls, allowed=allowed, instructions=instructions)

    assert leaks == [], leaks
    assert all(traffic_lines(requests[stage]) for stage in ("search", "fix", "pr"))
    # The same check on the same requests, with search's traffic planted in plan's and fix's:
    # as text, as ADK renders another agent's tool result, and as a function call part.
    search_response = next(
        part["functionResponse"]
        for request in requests["search"]
        for content in request["contents"]
        for part in content["parts"]
        if part.get("functionResponse", {}).get("name") == "read_file"
    )
    name, args = json.loads(sorted(own_calls["search"])[0])  # one of search's own calls
    planted = copy.deepcopy(requests)
    planted["plan"][0]["contents"].append(
        {"role": "user", "parts": [{"text": f"[search] said: {search_response['response']!r}"}]}
    )
    planted["fix"][-1]["contents"].insert(
        1, {"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]}
    )
    found = find_leaks(planted, own_calls=own_calls, allowed=allowed, instructions=instructions)
    assert {leak.seen_by for leak in found} == {"plan", "fix"}
    assert ("search", "plan", "tool traffic") in {(x.owner, x.seen_by, x.kind) for x in found}
    assert [(x.owner, x.kind) for x in found if x.seen_by == "fix"] == [
        ("search", "function call part")
    ]


CONTROL_STAGES = ["triage", "search", "plan"]
CONTROL_READS = {"triage": "shopcart/cart.py", "search": "shopcart/checkout.py",
                 "plan": "tests/test_cart.py"}  # fmt: skip
CONTROL = {
    "agents": {
        stage: [
            {"call": {"name": "read_file", "args": {"path": CONTROL_READS[stage]}}},
            {"json": {"summary": f"{stage}: read {CONTROL_READS[stage]}"}},
        ]
        for stage in CONTROL_STAGES
    }
}


async def shared_session(base_url: str, repo: Path) -> None:
    """The control stages as one ADK `SequentialAgent` session with default contents."""
    model = build_model(ModelConfig(base_url=base_url, api_key=SecretStr(CANARY_KEY)),
                        RetryConfig())  # fmt: skip
    tools = build_tools(["read_file"], LocalWorkspace(repo), MemoryArtifacts())
    agents = [
        LlmAgent(name=stage, model=model, instruction=f"You are the {stage} stage.", tools=tools,
                 output_key=f"{stage}_out")
        for stage in CONTROL_STAGES
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialAgent is deprecated in ADK 2.x
        pipeline = SequentialAgent(name="pipeline", sub_agents=agents)
    runner = Runner(agent=pipeline, app_name="control", session_service=InMemorySessionService())
    session = await runner.session_service.create_session(app_name="control", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text="Read what you need.")])
    async for _ in runner.run_async(user_id="u", session_id=session.id, new_message=message):
        pass
    await runner.close()
    await close_model(model)


def test_the_same_check_reports_a_shared_adk_session_as_leaking(
    stack: Stack, tmp_path: Path
) -> None:
    repo = shutil.copytree(SAMPLE_REPO, tmp_path / "repo")
    stack.fake.set_scenario(CONTROL)

    asyncio.run(shared_session(stack.fake.url, repo))
    requests = stage_requests(stack, CONTROL_STAGES)
    leaks = find_leaks(
        requests,
        own_calls={stage: scripted_calls(CONTROL, stage) for stage in CONTROL_STAGES},
        allowed={},
    )

    assert {(leak.owner, leak.seen_by) for leak in leaks} == {
        ("triage", "search"),
        ("triage", "plan"),
        ("search", "plan"),
    }
    assert {leak.kind for leak in leaks} == {"tool traffic"}


def test_only_referenced_upstream_outputs_reach_a_stage_within_budget(
    stack: Stack, run_store: RunStore
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status == RunStatus.DONE, run.reason
    pipeline = load_pipeline("fixer")
    outputs = {s: run_store.output(run.id, s) for s in STAGES}
    marker = {  # a phrase only that stage's output holds (from the demo scenario)
        "triage": outputs["triage"]["error_summary"],
        "search": outputs["search"]["root_cause"],
        "plan": outputs["plan"]["approach"],
        "fix": outputs["fix"]["summary"],
    }
    for stage in STAGES:
        spec = pipeline.stage(stage)
        for request in (e["request"] for e in stack.requests(stage)):
            system = json.dumps(request.get("systemInstruction"))
            for upstream, phrase in marker.items():
                shown = json.dumps(phrase)[1:-1] in system
                assert shown == (upstream in spec.inputs), f"{upstream} output in {stage}: {shown}"
        for upstream in spec.inputs:
            if upstream in marker:
                budget = pipeline.stage(upstream).budget.max_output_chars
                assert run.stages[upstream].output_chars <= budget


def test_token_counts_match_what_the_server_counted(stack: Stack) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status == RunStatus.DONE, run.reason
    for stage in STAGES:
        served = [e for e in stack.requests(stage) if e["status"] == 200]
        record = run.stages[stage]
        assert record.requests == len(served)
        assert record.prompt_tokens_total == sum(e["prompt_tokens"] for e in served)
        assert record.prompt_tokens_max == max(e["prompt_tokens"] for e in served)
        # Thinking is billed as output: the reply's thoughts count with its candidates.
        assert record.output_tokens == sum(
            e["candidates_tokens"] + e["thoughts_tokens"] for e in served
        )


def test_every_stage_event_is_in_the_audit_log_tagged_with_branch_and_session(
    stack: Stack, run_store: RunStore
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    log = run_store.audit_log(run.id)
    for stage in STAGES:
        entries = [e for e in log if e["branch"] == f"fixer.{stage}"]
        assert {e["session"] for e in entries} == {f"{run.id}:{stage}:1"}
        kinds = [e["kind"] for e in entries]
        assert kinds[0] == "stage_begin" and "user_message" in kinds and "model_reply" in kinds
    fix_kinds = [e["kind"] for e in log if e["branch"] == "fixer.fix"]
    assert fix_kinds.count("tool_call") == 5 and fix_kinds.count("tool_result") == 5


def test_the_api_key_never_reaches_a_request_the_audit_log_an_artifact_or_a_log_line(
    stack: Stack, run_store: RunStore
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    artifacts = [
        run_store.artifact(ref)
        for record in run.stages.values()
        for ref in record.artifacts.values()
    ]

    assert stack.requests() and artifacts and run_store.audit_log(run.id)
    assert CANARY_KEY not in json.dumps(stack.requests())
    assert CANARY_KEY not in json.dumps(run_store.audit_log(run.id))
    assert all(CANARY_KEY.encode() not in data for data in artifacts)
    assert CANARY_KEY not in (stack.workdir / "worker.log").read_text()

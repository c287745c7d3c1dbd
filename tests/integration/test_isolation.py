"""A whole fixer run over Celery and Redis, checked from the fake server's request log."""

from __future__ import annotations

import json
from typing import Any

from demo import SENTRY_EVENT
from orchestrator.models import RunStatus, StageStatus
from orchestrator.pipeline import load_pipeline
from orchestrator.store import RunStore
from tests.repos import Git

from .conftest import CANARY_KEY, Stack

STAGES = ["triage", "search", "plan", "fix", "pr"]


def texts(value: Any) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in texts(v)]
    return []


def tool_traffic(request: dict[str, Any]) -> list[str]:
    """Text of the function calls and function responses in a request (length > 30)."""
    found = []
    for content in request.get("contents", []):
        for part in content.get("parts", []):
            for key in ("functionCall", "functionResponse"):
                if key in part:
                    found += [t for t in texts(part[key]) if len(t) > 30]
    return found


def static_lines(instruction: str) -> list[str]:
    """The lines of an instruction template that hold no placeholder."""
    return [
        line.strip()
        for line in instruction.splitlines()
        if len(line.strip()) > 30 and "{" not in line
    ]


def test_the_sample_issue_runs_all_five_stages_and_pushes_the_fix(stack: Stack, git: Git) -> None:
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.DONE, run.reason
    assert [run.stages[s].status for s in STAGES] == [StageStatus.DONE] * 5
    branch = f"baton/{run.id}"
    changed = git("diff", "--stat", f"main..{branch}", cwd=repo)
    assert "shopcart/cart.py | 5 ++++-" in changed
    assert "1 file changed" in changed


def own_view_removed(request: dict[str, Any]) -> str:
    """A request without the stage's own tool traffic: its instruction and its text contents."""
    texts_only = [
        part.get("text", "")
        for content in request.get("contents", [])
        for part in content.get("parts", [])
    ]
    return json.dumps([request.get("systemInstruction"), texts_only])


def test_no_stage_sees_another_stages_instruction_or_tool_traffic(
    stack: Stack, run_store: RunStore
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status == RunStatus.DONE, run.reason
    requests = {stage: [e["request"] for e in stack.requests(stage)] for stage in STAGES}
    pipeline = load_pipeline("fixer")

    for stage in STAGES:
        own_traffic = {t for r in requests[stage] for t in tool_traffic(r)}
        own_lines = static_lines(pipeline.stage(stage).instruction)
        assert requests[stage], f"{stage} made no request"
        for other in STAGES:
            if other == stage:
                continue
            handed_over = json.dumps(run_store.outputs(run.id, pipeline.stage(other).inputs))
            for request in requests[other]:
                view = own_view_removed(request)
                leaked = [
                    t
                    for t in own_traffic
                    if json.dumps(t)[1:-1] in view and json.dumps(t)[1:-1] not in handed_over
                ]
                assert not leaked, f"{other} saw tool traffic of {stage}: {leaked[:2]}"
                blob = json.dumps(request)
                leaked = [line for line in own_lines if line in blob]
                assert not leaked, f"{other} saw the instruction of {stage}: {leaked[:2]}"


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
    assert fix_kinds.count("tool_call") == 4 and fix_kinds.count("tool_result") == 4


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

"""Execute one stage of one run: plain functions, callable without Celery.

The stage's session is seeded with the issue digest and only the upstream outputs its
instruction references. Code stages work in a fresh sandbox (`workers.sandboxes`). Fields
Baton measures itself — test results, the published branch and commit — replace whatever the
model said about them.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.adk.models.base_llm import BaseLlm
from pydantic import BaseModel, ValidationError

import sandbox
from orchestrator.conductor import StageResult
from orchestrator.pipeline import ISSUE_KEY, StageSpec
from orchestrator.store import RunStore
from workers import output as outputs
from workers import proof
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.budget import json_chars
from workers.errors import StageCancelledError, StageError, StageOutputError, TestsFailedError
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.sandboxes import StageJob, StoreArtifacts, open_workspace
from workers.tools.code import DIFF_ARTIFACT, build_tools
from workers.tools.workspace import Workspace

logger = logging.getLogger(__name__)

WRITE_TOOLS = frozenset({"edit_file", "apply_patch"})
REPAIR_MODEL_CALLS = 2
COMPACTOR = "compactor"

__all__ = ["StageJob", "StageServices", "execute_stage", "seed_state"]

Audit = Callable[[list[dict[str, Any]]], Any]


@dataclass(frozen=True)
class StageServices:
    """What a worker process lends every stage it runs."""

    store: RunStore
    repos: RepoCache
    sandbox: sandbox.SandboxConfig
    publisher: Publisher


def seed_state(job: StageJob, store: RunStore) -> dict[str, Any]:
    """The issue digest and the upstream outputs this stage's instruction references."""
    wanted = [key for key in job.spec.inputs if key != ISSUE_KEY]
    state: dict[str, Any] = store.outputs(job.run.id, wanted)
    if ISSUE_KEY in job.spec.inputs:
        state[ISSUE_KEY] = job.run.issue.digest()
    return state


async def execute_stage(
    job: StageJob,
    services: StageServices,
    *,
    model: BaseLlm,
    streaming: bool = False,
    cancelled: threading.Event | None = None,
) -> StageResult:
    """Run the stage's agent once, validate (one repair turn), verify and size its output.

    With `cancelled`, every model and tool call first checks it and stops the stage
    (`StageCancelledError`) once it is set.
    """
    spec, usage, store = job.spec, Usage(), services.store

    def checkpoint() -> None:
        if cancelled is not None and cancelled.is_set():
            raise StageCancelledError()

    schema = spec.schema_class()
    artifacts = StoreArtifacts(store, job.run.id, spec.name)
    facts: dict[str, Any] = {}

    def audit(entries: list[dict[str, Any]]) -> Any:
        return store.audit(job.run.id, entries)

    with _maybe_workspace(job, services) as workspace:
        if spec.verify and workspace is not None:
            facts["tests_before"] = _verify(job, store, workspace, artifacts, "before")
        tools = _tools(job, services, workspace, artifacts, facts)
        agent = build_agent(
            AgentSpec(
                name=spec.name,
                instruction=spec.instruction,
                contract=outputs.contract(schema),
                budget=spec.budget,
                tools=tools,
                json_reply=not tools,
                checkpoint=checkpoint,
            ),
            model,
            usage,
        )
        async with StageSession.open(
            agent,
            session_id=job.labels["session"],
            state=seed_state(job, store),
            audit=audit,
            labels=job.labels,
            usage=usage,
            streaming=streaming,
        ) as session:
            result = await _reply(session, spec, schema)
        if spec.verify and workspace is not None:
            facts["tests_after"] = _verify(job, store, workspace, artifacts, "after")
        if workspace is not None and WRITE_TOOLS & set(spec.tools):
            artifacts.save(DIFF_ARTIFACT, workspace.diff().encode(), "text/x-diff")
    result, compacted = await _fit_budget(result, job, schema, model, usage, audit, streaming)
    result = _with_facts(result, facts, schema)
    _require_passing_tests(spec, facts)
    logger.info(
        "stage %s of run %s: %d model calls, %d prompt tokens, output %d chars",
        spec.name, job.run.id, usage.requests, usage.prompt_tokens_total, json_chars(result),
    )  # fmt: skip
    return StageResult(
        output=result,
        requests=usage.requests,
        prompt_tokens_total=usage.prompt_tokens_total,
        prompt_tokens_max=usage.prompt_tokens_max,
        output_tokens=usage.output_tokens,
        compacted=compacted,
        artifacts=artifacts.saved,
    )


@contextmanager
def _maybe_workspace(job: StageJob, services: StageServices) -> Iterator[Workspace | None]:
    """A sandboxed workspace for a stage with tools; none for one without."""
    if not job.spec.tools:
        yield None
        return
    with open_workspace(
        job, store=services.store, repos=services.repos, config=services.sandbox
    ) as workspace:
        yield workspace


async def _reply(session: StageSession, spec: StageSpec, schema: type[BaseModel]) -> dict[str, Any]:
    text = await session.turn(
        f"Do the {spec.name} stage now.", max_model_calls=spec.budget.max_model_calls
    )
    try:
        return outputs.parse(text, schema)
    except StageOutputError as first:
        logger.info("stage %s output invalid, one repair turn: %s", spec.name, first.message)
        text = await session.turn(outputs.repair_message(first), max_model_calls=REPAIR_MODEL_CALLS)
    try:
        return outputs.parse(text, schema)
    except StageOutputError as second:
        raise StageOutputError(
            f"stage {spec.name!r} output is invalid after one repair turn: {second.message}"
        ) from second


def _verify(
    job: StageJob, store: RunStore, workspace: Workspace, artifacts: StoreArtifacts, when: str
) -> dict[str, Any]:
    """Run the stage's verification command; the measured result, its log an artifact."""
    assert job.spec.verify is not None
    key, field = job.spec.verify.source
    command = (store.output(job.run.id, key) or {}).get(field)
    if not isinstance(command, str) or not command.strip():
        raise StageError(f"stage {key!r} gave no {field!r} to verify {job.spec.name!r} with")
    timeout_s = min(300.0, job.spec.budget.soft_time_limit_s / 4)
    run, log = proof.run_tests(workspace, command, timeout_s=timeout_s)
    artifacts.save(f"tests-{when}.log", log.encode())
    logger.info("tests %s %s of run %s: %s", when, job.spec.name, job.run.id, proof.describe(run))
    return run.model_dump(mode="json")


def _require_passing_tests(spec: StageSpec, facts: dict[str, Any]) -> None:
    if not (spec.verify and spec.verify.require_pass and "tests_after" in facts):
        return
    after = proof.TestRun.model_validate(facts["tests_after"])
    if not proof.succeeded(after):
        before = proof.TestRun.model_validate(facts["tests_before"])
        raise TestsFailedError(
            f"the tests still fail after the change (`{after.command}`: {proof.describe(after)}; "
            f"before: {proof.describe(before)}), so it is not handed on or published"
        )


def _with_facts(
    result: dict[str, Any], facts: dict[str, Any], schema: type[BaseModel]
) -> dict[str, Any]:
    """The output with the fields Baton measured itself in place of the model's."""
    known = {k: v for k, v in facts.items() if k in schema.model_fields}
    if not known:
        return result
    try:
        return schema.model_validate({**result, **known}).model_dump(mode="json")
    except ValidationError as exc:
        raise StageOutputError(f"measured fields do not fit {schema.__name__}: {exc}") from exc


def _tools(
    job: StageJob,
    services: StageServices,
    workspace: Workspace | None,
    artifacts: StoreArtifacts,
    facts: dict[str, Any],
) -> list[Callable[..., Any]]:
    if workspace is None:
        return []

    def publish(title: str, body: str, diff: str) -> dict[str, Any]:
        evidence = proof.evidence(_verified_tests(job, services.store))
        with tempfile.TemporaryDirectory(prefix="baton-publish-") as tmp:
            published = services.publisher.publish(
                repo=job.run.repo,
                commit=job.run.commit,
                diff=diff.encode(),
                branch=f"baton/{job.run.id}",
                title=title,
                body=f"{body}\n\n{evidence}".strip(),
                workdir=Path(tmp),
            )
        facts.update(branch=published.branch, commit=published.commit)
        answer = published.model_dump(mode="json")
        artifacts.save("published.json", json.dumps(answer).encode(), "application/json")
        return answer

    return build_tools(
        job.spec.tools,
        workspace,
        artifacts,
        test_timeout_s=min(300, job.spec.budget.soft_time_limit_s // 2),
        publish=publish,
    )


def _verified_tests(job: StageJob, store: RunStore) -> dict[str, Any] | None:
    """The measured tests of the newest earlier stage that verifies with them."""
    for stage in job.pipeline.before(job.spec.name):
        if stage.verify:
            return store.output(job.run.id, stage.output_key)
    return None


async def _fit_budget(
    result: dict[str, Any],
    job: StageJob,
    schema: type[BaseModel],
    model: BaseLlm,
    usage: Usage,
    audit: Audit,
    streaming: bool,
) -> tuple[dict[str, Any], str | None]:
    """An output over its budget is summarized by a model call, else cut with markers."""
    limit = job.spec.budget.max_output_chars
    if json_chars(result) <= limit:
        return result, None
    agent = build_agent(
        AgentSpec(
            name=COMPACTOR,
            instruction=(
                f"You shorten the output of a pipeline stage to at most {limit} characters of "
                "JSON. Keep the same fields and every fact a later stage needs: names, paths, "
                "line numbers, commands, decisions. Drop repetition and prose first."
            ),
            contract=outputs.contract(schema),
            budget=job.spec.budget.model_copy(update={"max_model_calls": 2}),
            json_reply=True,
        ),
        model,
        usage,
    )
    labels = {**job.labels, "session": job.labels["session"] + ":compact"}
    try:
        async with StageSession.open(
            agent,
            session_id=labels["session"],
            state={},
            audit=audit,
            labels=labels,
            usage=usage,
            streaming=streaming,
        ) as session:
            text = await session.turn(json.dumps(result, ensure_ascii=False), max_model_calls=2)
        summary = outputs.parse(text, schema)
        if json_chars(summary) <= limit:
            return summary, "summarized"
        logger.info(
            "summary of %s still over budget (%d chars)", job.spec.name, json_chars(summary)
        )
    except StageError as exc:
        logger.info("summarizing %s failed (%s); cutting instead", job.spec.name, exc)
    return outputs.truncate_to_budget(result, schema, limit), "truncated"

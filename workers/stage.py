"""Execute one stage of one run: plain functions, callable without Celery.

The stage's session is seeded with the issue digest and only the upstream outputs its
instruction references. Code stages get a fresh working copy of the run's pinned commit with
the upstream stages' changes applied; what they change is recorded as the `workspace.diff`
artifact, which carries their work to the stages after them.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.adk.models.base_llm import BaseLlm
from pydantic import BaseModel

from orchestrator.conductor import StageResult, branch_label, session_id
from orchestrator.models import ArtifactRef, RunRecord
from orchestrator.pipeline import ISSUE_KEY, Pipeline, StageSpec
from orchestrator.store import RunStore
from workers import output as outputs
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.budget import json_chars
from workers.errors import StageError, StageOutputError
from workers.repos import RepoCache
from workers.tools.code import build_tools
from workers.tools.errors import ToolError
from workers.tools.workspace import LocalWorkspace, Workspace

logger = logging.getLogger(__name__)

WORKSPACE_DIFF = "workspace.diff"
"""Artifact that carries a code stage's changes to the stages after it."""
WRITE_TOOLS = frozenset({"edit_file", "apply_patch"})
REPAIR_MODEL_CALLS = 2
COMPACTOR = "compactor"


@dataclass(frozen=True)
class StageJob:
    """Everything one execution of one stage needs."""

    run: RunRecord
    pipeline: Pipeline
    spec: StageSpec
    attempt: int

    @property
    def labels(self) -> dict[str, str]:
        return {
            "branch": branch_label(self.run.pipeline, self.spec.name),
            "session": session_id(self.run.id, self.spec.name, self.attempt),
            "stage": self.spec.name,
        }


class StoreArtifacts:
    """The artifact sink of one stage: artifacts land in the run store under `<stage>/`."""

    def __init__(self, store: RunStore, run_id: str, stage: str) -> None:
        self._store, self._run_id, self._stage = store, run_id, stage
        self.saved: dict[str, ArtifactRef] = {}

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str:
        ref = self._store.put_artifact(self._run_id, f"{self._stage}/{name}", data, media_type)
        self.saved[name] = ref
        return ref.uri


def seed_state(job: StageJob, store: RunStore) -> dict[str, Any]:
    """The issue digest and the upstream outputs this stage's instruction references."""
    wanted = [key for key in job.spec.inputs if key != ISSUE_KEY]
    state: dict[str, Any] = store.outputs(job.run.id, wanted)
    if ISSUE_KEY in job.spec.inputs:
        state[ISSUE_KEY] = job.run.issue.digest()
    return state


async def execute_stage(
    job: StageJob, *, store: RunStore, model: BaseLlm, repos: RepoCache, streaming: bool = False
) -> StageResult:
    """Run the stage's agent once, validate (one repair turn) and size its output."""
    spec, usage = job.spec, Usage()
    schema = spec.schema_class()
    artifacts = StoreArtifacts(store, job.run.id, spec.name)

    def audit(entries: list[dict[str, Any]]) -> Any:
        return store.audit(job.run.id, entries)

    async with _workspace(job, store, repos) as workspace:
        tools = _tools(job, workspace, artifacts)
        agent = build_agent(
            AgentSpec(
                name=spec.name,
                instruction=spec.instruction,
                contract=outputs.contract(schema),
                budget=spec.budget,
                tools=tools,
                json_reply=not tools,
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
        if workspace is not None and WRITE_TOOLS & set(spec.tools):
            artifacts.save(WORKSPACE_DIFF, workspace.diff().encode(), "text/x-diff")
    result, compacted = await _fit_budget(result, job, schema, model, usage, audit, streaming)
    logger.info(
        "stage %s of run %s: %d model calls, %d prompt tokens, output %d chars",
        spec.name,
        job.run.id,
        usage.requests,
        usage.prompt_tokens_total,
        json_chars(result),
    )
    return StageResult(
        output=result,
        requests=usage.requests,
        prompt_tokens_total=usage.prompt_tokens_total,
        prompt_tokens_max=usage.prompt_tokens_max,
        output_tokens=usage.output_tokens,
        compacted=compacted,
        artifacts=artifacts.saved,
    )


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


async def _fit_budget(
    result: dict[str, Any],
    job: StageJob,
    schema: type[BaseModel],
    model: BaseLlm,
    usage: Usage,
    audit: Callable[[list[dict[str, Any]]], Any],
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


def _tools(
    job: StageJob, workspace: Workspace | None, artifacts: StoreArtifacts
) -> list[Callable[..., Any]]:
    if workspace is None:
        return []
    return build_tools(
        job.spec.tools,
        workspace,
        artifacts,
        test_timeout_s=min(300, job.spec.budget.soft_time_limit_s // 2),
        branch=f"baton/{job.run.id}",
    )


@asynccontextmanager
async def _workspace(
    job: StageJob, store: RunStore, repos: RepoCache
) -> AsyncIterator[Workspace | None]:
    """A fresh working copy at the pinned commit plus upstream changes; None without tools."""
    if not job.spec.tools:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix=f"baton-{job.spec.name}-") as tmp:
        path = repos.checkout(job.run.repo, job.run.commit, Path(tmp) / "repo")
        workspace = LocalWorkspace(path)
        upstream = _upstream_diff(job)
        if upstream is not None:
            diff = store.artifact(upstream).decode()
            try:
                if diff.strip():
                    workspace.apply_patch(diff)
            except ToolError as exc:
                raise StageError(
                    f"the changes of an earlier stage ({upstream.uri}) do not apply to "
                    f"{job.run.commit[:12]}: {exc.message}"
                ) from exc
        yield workspace


def _upstream_diff(job: StageJob) -> ArtifactRef | None:
    """The newest `workspace.diff` recorded by a stage before this one."""
    names = [s.name for s in job.pipeline.stages]
    for name in reversed(names[: names.index(job.spec.name)]):
        record = job.run.stages.get(name)
        if record and WORKSPACE_DIFF in record.artifacts:
            return record.artifacts[WORKSPACE_DIFF]
    return None

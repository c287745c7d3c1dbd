"""A recorded stage, played again offline: the model's replies come from the run's audit log,
served by the fake Gemini server in this process; the tools are real.

    result = replay(store, run_id, "fix")      # needs Docker for a stage with tools
    result.same_output, result.turns

Every reply a model gave is in the audit log (`workers.agent.StageSession` writes each
non-partial event). `script` turns one execution's replies into a scenario, one script per
agent (the stage's own and, if it ran, the compactor), in the order they were given. `replay`
resolves the stage's inputs from the run as the worker did, prepares the run's environment,
and runs `workers.stage.execute_stage` against that scenario in a fresh sandbox. It publishes
nothing and writes nothing into the run: artifacts and audit entries stay in memory, so a failed
stage (an evaluation instance's, say) can be stepped through again without a model or a key.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.errors import BatonError
from orchestrator.core.execution import session_id
from orchestrator.core.models import RunRecord
from orchestrator.core.specs import pipeline_of
from orchestrator.core.store import RunStore
from testkit.inprocess import InProcessGemini
from testkit.sinks import MemoryArtifacts
from workers.environments import Environments, given_spec
from workers.execution import as_execution_error
from workers.gemini import close_model
from workers.inputs import resolve
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.sandboxes import DockerSandboxes
from workers.settings import WorkerSettings
from workers.stage import StageSinks, execute_stage

REPLY_KINDS = ("tool_call", "model_reply")


class ReplayError(BatonError, ValueError):
    """Raised when a stage cannot be replayed: it never ran, or the audit log holds no reply of
    the execution asked for. The message says which."""


@dataclass(frozen=True)
class Turn:
    """One model reply of the recording, as the replay played it."""

    agent: str
    reply: str
    """What the model did: `call read_file, show_diff` or `text: {"summary": …`."""


@dataclass
class ReplayResult:
    stage: str
    attempt: int
    turns: list[Turn]
    recorded_output: dict[str, Any] | None
    output: dict[str, Any] | None = None
    error: str | None = None
    """Why the replayed execution ended without output."""
    requests: int = 0
    """Model requests the replay made (the fake server's count)."""
    artifacts: dict[str, bytes] = field(default_factory=dict)

    @property
    def same_output(self) -> bool:
        return self.output is not None and self.output == self.recorded_output


def script(entries: Iterable[Mapping[str, str]], session: str) -> dict[str, Any]:
    """The scenario that replays `session`'s model replies (audit entries of another session
    are skipped); its `turns` key lists them for display.

    Raises:
        ReplayError: the session has no reply on record.
    """
    agents: dict[str, list[dict[str, Any]]] = {}
    turns: list[Turn] = []
    for entry in entries:
        if entry.get("session") != session or entry.get("kind") not in REPLY_KINDS:
            continue
        content = json.loads(entry.get("data") or "{}").get("content") or {}
        step, shown = _step(content.get("parts") or [])
        if step is not None:
            agents.setdefault(entry.get("author", ""), []).append(step)
            turns.append(Turn(entry.get("author", ""), shown))
    if not turns:
        raise ReplayError(f"the audit log holds no model reply of {session}")
    return {
        "agents": {agent: {"steps": steps} for agent, steps in agents.items()},
        "turns": turns,
    }


def replay(
    store: RunStore,
    run_id: str,
    stage: str,
    *,
    attempt: int | None = None,
    settings: WorkerSettings | None = None,
) -> ReplayResult:
    """Run `stage` of `run_id` again (its latest attempt's replies by default); see the module.

    Raises:
        ReplayError: the stage never ran, or its replies are not on record.
        RunNotFoundError: no such run.
    """
    settings = settings or WorkerSettings()
    run = store.get(run_id)
    pipeline = pipeline_of(store, run)
    spec = pipeline.stage(stage)
    record = run.stages.get(stage)
    attempt = attempt or (record.attempts if record else 0)
    if attempt < 1:
        raise ReplayError(f"stage {stage!r} of run {run_id} never ran")
    scenario = script(store.audit_log(run_id), session_id(run_id, stage, attempt))
    turns = scenario.pop("turns")
    result = ReplayResult(stage, attempt, turns, store.output(run_id, spec.output_key))
    inputs = resolve(run, pipeline, spec, attempt, store)
    mirrors = RepoCache(settings.repo_cache_dir)
    if spec.tools:
        environment = _environment(run, store, mirrors, settings)
        inputs = inputs.in_environment(environment)
    fake = InProcessGemini(scenario)
    artifacts = MemoryArtifacts(run_id)
    audit: list[dict[str, Any]] = []
    sandboxes = DockerSandboxes(mirrors, settings.sandbox_config()) if spec.tools else None

    async def play() -> None:
        model = fake.model(settings.model)
        try:
            out = await execute_stage(
                inputs,
                model=model,
                sinks=StageSinks(artifacts=artifacts, audit=audit.extend),
                sandboxes=sandboxes,
                # A replay publishes nothing; a proof may still check what publishing would
                # refuse (`Publisher.refusal` pushes nothing).
                publisher=None if "publish" in spec.tools else Publisher(mirrors),
            )
            result.output = out.output
        except Exception as exc:  # as a worker would record it: a stage error, a sandbox's…
            result.error = str(as_execution_error(exc, spec))
        finally:
            await close_model(model)

    asyncio.run(play())
    result.requests = len(fake.requests())
    result.artifacts = dict(artifacts.data)
    return result


def _environment(
    run: RunRecord, store: RunStore, mirrors: RepoCache, settings: WorkerSettings
) -> Any:
    build = settings.build_settings()
    if not build.enabled:
        return None
    environments = Environments(
        store.redis, mirrors, build, sandbox_config=settings.sandbox_config()
    )
    return environments.prepare(run.repo, run.commit, spec=given_spec(run))


def _step(parts: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    calls = [p["function_call"] for p in parts if p.get("function_call")]
    if calls:
        named = [{"name": c.get("name", ""), "args": c.get("args") or {}} for c in calls]
        step = {"call": named[0]} if len(named) == 1 else {"calls": named}
        return step, "call " + ", ".join(c["name"] for c in named)
    text = "".join(p.get("text") or "" for p in parts if not p.get("thought"))
    if not text:
        return None, ""
    return {"text": text}, f"text: {text[:60]}{'…' if len(text) > 60 else ''}"

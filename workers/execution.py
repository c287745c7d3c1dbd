"""One execution of a stage inside a worker: the stage runner wired to the run store.

`Execution` resolves the stage's inputs from the store, gives `execute_stage` sinks that write
to the store, a fence that checks the run in the store, and the worker's sandboxes and
publisher; afterwards it says what the execution cost and left behind (`figures`), whether
it finished or not. Anything that ends an execution is turned into an `ExecutionError` here,
once (`failure`), so the task, the metrics and the run's reason all read the same answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

import sandbox
from orchestrator.core.children import ChildStore
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import RepoError
from orchestrator.core.execution import Hold, StageFigures
from orchestrator.core.models import ArtifactRef, RunRecord
from orchestrator.core.pipeline import CHANGE_KEY, Pipeline, StageSpec
from orchestrator.core.prices import ModelPrice
from orchestrator.core.providers import parse_model
from orchestrator.core.settings import ModelConfig, ProviderConfig, RetryConfig
from orchestrator.core.spend import SpendLedger
from orchestrator.core.store import RunStore
from sandbox.build import EnvironmentBuildError, EnvironmentValidationError
from sandbox.errors import EnvironmentSpecError
from workers.agent import Usage
from workers.environments import Environment, Environments, given_spec
from workers.errors import (
    ExecutionError,
    InfrastructureError,
    InternalError,
    LeaseLostError,
    StageCancelledError,
    StageError,
    StageTimeLimitError,
)
from workers.gemini import BatonGemini, ModelClients, build_model, close_model, model_error
from workers.governed import GovernedLlm
from workers.governor import Governor
from workers.holding import Holding
from workers.inputs import StageInputs, newest_change, resolve
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.sandboxes import Sandboxes
from workers.spending import RunSpending, count_handoff
from workers.stage import StageOutput, StageSinks, execute_stage
from workers.subsessions import BRANCH, SESSION
from workers.timings import ENVIRONMENT, Timings, recording, timed

logger = logging.getLogger(__name__)

REQUESTS_ARTIFACT = "model-requests.jsonl"
"""Every model request of an execution, as sent (`WorkerServices.keep_model_requests`)."""
ENV_BUILD_ARTIFACT = "environment-build.log"
ENV_BASELINE_ARTIFACT = "environment-baseline.log"

CHECKPOINT_EVERY_S = 0.25
"""How stale the store's word that an execution holds its stage may be at a safe point."""


@dataclass(frozen=True)
class WorkerServices:
    """What a worker process lends every execution it runs."""

    conductor: Conductor
    sandboxes: Sandboxes
    publisher: Publisher
    governor: Governor | None
    model: ModelConfig
    retry: RetryConfig
    providers: Mapping[str, ProviderConfig] = field(default_factory=dict)
    """How to reach each LiteLLM provider a stage may name (`Settings.provider_section`)."""
    streaming: bool = False
    environments: Environments | None = None
    """Builds and finds the runs' environments; None: code stages use the plain sandbox
    image."""
    clients: ModelClients | None = None
    """The process's shared google-genai clients; None: each execution makes its own."""
    loop: asyncio.AbstractEventLoop | None = None
    """The process's one event loop, which every execution runs on (the shared clients' HTTP
    connections belong to it); None: each execution gets a new loop."""
    keep_model_requests: bool = False
    """Save every model request as the artifact `REQUESTS_ARTIFACT`."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The worker's environment, where the secrets declared tools name are read."""
    mirrors: RepoCache | None = None
    """The host's repository cache, where the change a run reviews (`{change}`) is read."""
    prices: Mapping[str, ModelPrice] = field(default_factory=dict)
    """The deployment's model prices (`BATON_PRICES`), over `orchestrator.core.prices`'s."""

    @property
    def store(self) -> RunStore:
        return self.conductor.store


class StoreArtifacts:
    """The artifact sink of one execution: artifacts land in the run store under `folder`
    (`<stage>/`, or a branch's `<stage>/<branch>/`: `Held.folder`), and `saved` keeps what was
    stored, by name."""

    def __init__(self, store: RunStore, run_id: str, folder: str) -> None:
        self._store, self._run_id, self._folder = store, run_id, folder
        self.saved: dict[str, ArtifactRef] = {}

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str:
        ref = self._store.put_artifact(self._run_id, f"{self._folder}/{name}", data, media_type)
        self.saved[name] = ref
        return ref.uri


class AuditBuffer:
    """The audit sink of one execution. Entries wait here until the stage is about to block on
    a model or tool call (a safe point, `Execution.checkpoint`), so that what a quick turn
    makes goes out in one round trip and a watcher still sees it before the wait; what is left
    when the execution ends rides the transaction that records how it ended
    (`StageFigures.audit`)."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self._store, self._run_id = store, run_id
        self.pending: list[dict[str, Any]] = []

    def __call__(self, entries: list[dict[str, Any]]) -> None:
        self.pending.extend(entries)

    def flush(self) -> None:
        if self.pending:
            self._store.audit(self._run_id, self.pending)
            self.pending = []


class Execution:
    """One execution of `spec` for `run`: of the stage, or of one of its branches, as
    `holding` says (whose `owner` this execution is)."""

    def __init__(
        self,
        services: WorkerServices,
        run: RunRecord,
        pipeline: Pipeline,
        spec: StageSpec,
        *,
        attempt: int,
        holding: Holding,
    ) -> None:
        self.services = services
        self.run, self.pipeline, self.spec = run, pipeline, spec
        self.attempt, self.holding = attempt, holding
        self.artifacts = StoreArtifacts(services.store, run.id, holding.held.folder)
        self.audit = AuditBuffer(services.store, run.id)
        self.usage = Usage()
        self.stopped_as: Hold = Hold.HELD
        """Set by the heartbeat when it finds the execution must stop."""
        self.environment: str | None = None
        """The key of the environment the execution's sandboxes started from."""
        self._model: GovernedLlm | None = None
        self._summarizer: GovernedLlm | None = None
        """The model of the stage's compaction when it names another than the stage's."""
        self._held_at = time.monotonic()
        """When the store last said this execution holds its stage (`begin` just did)."""

    @property
    def owner(self) -> str:
        return self.holding.owner

    async def execute(self) -> StageOutput:
        """Resolve the inputs and run the stage, timing its phases (`workers.timings`: on the
        audit log as it ends); raises an `ExecutionError` if it has no output."""
        with recording() as spent:
            try:
                return await self._execute()
            finally:
                self.audit([self._timings_entry(spent)])

    def _timings_entry(self, spent: Timings) -> dict[str, Any]:
        held, record = self.holding.held, self.run.stages.get(self.spec.name)
        labels = {"stage": held.stage, BRANCH: held.label(self.pipeline.name),
                  SESSION: held.session_id(self.attempt)}  # fmt: skip
        return spent.entry(labels, iteration=record.iteration if record is not None else 1)

    async def _execute(self) -> StageOutput:
        sinks = StageSinks(
            artifacts=self.artifacts,
            audit=self.audit,
            usage=self.usage,
            requests=[] if self.services.keep_model_requests else None,
            children=ChildStore(self.services.store.redis, self.run.id),
        )
        try:
            inputs = resolve(self.run, self.pipeline, self.spec, self.attempt,
                             self.services.store, branch=self.holding.held.branch)  # fmt: skip
            if CHANGE_KEY in self.spec.inputs:
                inputs = await self._with_change(inputs)
            if inputs.needs_workspace:
                inputs = inputs.in_environment(await self._environment())
            self._model = self._build_model()
            self._summarizer = self._build_summarizer()
            return await execute_stage(
                inputs,
                model=self._model,
                sinks=sinks,
                sandboxes=self.services.sandboxes,
                publisher=self.services.publisher,
                fence=self.fence,
                checkpoint=self.checkpoint,
                streaming=self.services.streaming,
                environ=self.services.environ,
                summarizer=self._summarizer,
                handoff=self._count_handoff if self.run.budget is not None else None,
            )
        finally:
            for model in (self._model, self._summarizer):
                if isinstance(model, BatonGemini):
                    await close_model(model)
            if sinks.requests:  # kept whether the stage finished or not
                self._keep_requests(sinks.requests)

    def _keep_requests(self, requests: list[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(request) + "\n" for request in requests)
        try:
            self.artifacts.save(REQUESTS_ARTIFACT, lines.encode(), "application/x-ndjson")
        except Exception:  # how the execution ended matters more than this record of it
            logger.warning("could not keep the model requests of %s of run %s",
                           self.spec.name, self.run.id, exc_info=True)  # fmt: skip

    async def _with_change(self, inputs: StageInputs) -> StageInputs:
        """The inputs with the change under review: the newest one an earlier stage of the run
        made and kept (a fix, for a review), else the run's base to its commit, read from the
        host's mirror (in a thread: it may fetch)."""
        made = newest_change(self.run, self.pipeline, self.spec, self.services.store)
        if made is not None:
            return inputs.with_change(made)
        base, mirrors = self.run.base, self.services.mirrors
        if base is None:
            raise StageError(
                f"stage {self.spec.name!r} reads {{{CHANGE_KEY}}}, but run {self.run.id} has no "
                "base and no earlier stage made a change: enqueue it with a pull request, or "
                "with --base"
            )
        if mirrors is None:
            raise StageError(f"stage {self.spec.name!r} reads {{{CHANGE_KEY}}}; this worker "
                             "has no repository cache to read it from")  # fmt: skip
        diff = await asyncio.to_thread(mirrors.diff, self.run.repo, base, self.run.commit)
        return inputs.with_change(diff)

    async def _environment(self) -> Environment | None:
        """The run's environment (built in a thread the first time, the fleet over), its logs
        kept as artifacts of the execution that built it."""
        environments = self.services.environments
        if environments is None or not environments.settings.enabled:
            return None
        with timed(ENVIRONMENT):
            env = await asyncio.to_thread(
                environments.prepare, self.run.repo, self.run.commit, spec=given_spec(self.run)
            )
        self.environment = env.key
        if env.build_log:
            self.artifacts.save(ENV_BUILD_ARTIFACT, env.build_log.encode())
        if env.test_log:
            self.artifacts.save(ENV_BASELINE_ARTIFACT, env.test_log.encode())
        return env

    def fence(self) -> None:
        """Raise unless this execution still holds its stage of a run that goes on: read from
        the store, so that a cancel is seen at once, not at the next heartbeat. Called right
        before a side effect (a push)."""
        hold = self.stopped_as
        if hold == Hold.HELD:
            hold = self.holding.hold()
            self._held_at = time.monotonic()
        if hold == Hold.CANCELLED:
            raise StageCancelledError()
        if hold == Hold.LOST:
            raise LeaseLostError(
                f"another execution holds {self.holding.held} of {self.run.id} now"
            )

    def checkpoint(self) -> None:
        """A safe point (before a model or tool call): the audit entries made since the last
        one are written, then the fence, asking the store at most every `CHECKPOINT_EVERY_S`,
        so a stage that calls often notices a cancel within that long without a round trip per
        call. Nothing that shows outside depends on it: the push has its own fence and a
        cancelled run's output is refused where it would be recorded."""
        self.audit.flush()
        if self.stopped_as == Hold.HELD and time.monotonic() - self._held_at < CHECKPOINT_EVERY_S:
            return
        self.fence()

    def figures(self) -> StageFigures:
        """What the execution cost and left behind so far."""
        return StageFigures(
            requests=self.usage.requests,
            prompt_tokens_total=self.usage.prompt_tokens_total,
            prompt_tokens_max=self.usage.prompt_tokens_max,
            output_tokens=self.usage.output_tokens,
            quota_wait_s=sum(m.waited_s for m in (self._model, self._summarizer) if m),
            artifacts=dict(self.artifacts.saved),
            audit=tuple(self.audit.pending),
            environment=self.environment,
        )

    def failure(self, exc: BaseException) -> ExecutionError:
        """Why the execution ended, as an `ExecutionError`."""
        error = as_execution_error(exc, self.spec, stopped_as=self.stopped_as)
        if isinstance(error, InternalError):
            logger.error("stage %s of run %s crashed", self.holding.held, self.run.id,
                         exc_info=exc)  # fmt: skip
        return error

    def _build_summarizer(self) -> GovernedLlm | None:
        """The model a compacting stage summarises with, when it names one of its own."""
        rule = self.spec.compaction
        own = self.pipeline.model_of(self.spec, self.services.model.name)
        if rule is None or not rule.model or rule.model == own:
            return None
        return self._build_model(rule.model)

    def _build_model(self, model_id: str | None = None) -> GovernedLlm:
        """The stage's model (`Pipeline.model_of`), or `model_id`: Gemini through google-genai,
        or another provider through LiteLLM, which is imported only then."""
        svc, run_id, stage = self.services, self.run.id, self.spec.name
        ref = parse_model(model_id or self.pipeline.model_of(self.spec, svc.model.name))

        def on_wait(seconds: float, why: str) -> None:
            svc.conductor.show_wait(run_id, stage, seconds, why)

        model: GovernedLlm
        if ref.via_litellm:
            from workers import lite_llm

            cfg = svc.providers.get(ref.provider) or ProviderConfig(provider=ref.provider)
            model = lite_llm.build_model(
                ref, cfg, svc.retry, governor=svc.governor, on_wait=on_wait, stage=stage
            )
        else:
            gemini = svc.model.model_copy(update={"name": ref.id})
            shared = svc.clients.get(gemini, svc.retry) if svc.clients is not None else None
            model = build_model(
                gemini, svc.retry, governor=svc.governor, on_wait=on_wait, stage=stage,
                client=shared,
            )  # fmt: skip
        model.spending = self._spending()
        return model

    def _count_handoff(self) -> None:
        """A subagent of the stage is about to start: one of the run's hand-offs."""
        count_handoff(self.services.store, self.run.id)

    def _spending(self) -> RunSpending | None:
        """The run's budget as this execution spends from it; None: the run has none."""
        if self.run.budget is None:
            return None
        record = self.run.stages.get(self.spec.name)
        return RunSpending(
            ledger=SpendLedger(self.services.store.redis),
            run_id=self.run.id,
            budget=self.run.budget,
            started_at=self.run.created_at,
            iteration=record.iteration if record is not None else 1,
            prices=self.services.prices,
        )


_OUTSIDE_ERRORS: tuple[tuple[type[BaseException], type[ExecutionError], str], ...] = (
    (sandbox.SandboxUnavailableError, InfrastructureError, "the sandbox failed: "),
    (sandbox.SandboxStartError, StageError, "no sandbox could be started: "),
    # The same files, or the same environment, would fail the same way again:
    (sandbox.SandboxFileError, StageError, "the sandbox refused a file operation: "),
    (EnvironmentSpecError, StageError, "the repository's environment: "),
    (EnvironmentBuildError, StageError, "the repository's environment: "),
    (EnvironmentValidationError, StageError, "the repository's environment: "),
    (RepoError, StageError, ""),
)
"""What the outside world raises, as the `ExecutionError` that decides its handling (retried
only for the daemon's own failures)."""


def as_execution_error(
    exc: BaseException, spec: StageSpec, *, stopped_as: Hold = Hold.HELD
) -> ExecutionError:
    """Whatever ended an execution of `spec`, as the `ExecutionError` that says how it is
    handled: Baton's own errors as they are, the heartbeat's interruption as a cancel (or a
    lost lease), and the outside world's (Celery's time limit, Docker, git, the model API) as
    the matching subclass; anything else is an `InternalError` naming its type."""
    if isinstance(exc, ExecutionError):
        return exc
    if isinstance(exc, asyncio.CancelledError) or stopped_as != Hold.HELD:
        if stopped_as == Hold.LOST:
            return LeaseLostError(f"another execution holds {spec.name} now")
        return StageCancelledError()
    if isinstance(exc, SoftTimeLimitExceeded):
        limit = spec.budget.soft_time_limit_s
        return StageTimeLimitError(f"stage exceeded its soft time limit of {limit}s")
    for kind, error, saying in _OUTSIDE_ERRORS:
        if isinstance(exc, kind):
            return error(f"{saying}{exc}")
    mapped = model_error(exc)
    if mapped is not None:
        return mapped
    return InternalError(f"internal error: {type(exc).__name__}: {exc}")

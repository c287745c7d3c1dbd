"""The Celery tasks: a stage's (decode the message, run the stage, record the result, declare
retries), and an environment build handed to this daemon's builder.

The stage itself is `workers.stage.execute_stage`, wired to the run store by
`workers.execution.Execution`; this module only adapts it to Celery. How an execution that
ended without output is handled is the error's own answer (`ExecutionError.retry`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from functools import cache
from typing import Any

from celery import Task
from celery.signals import worker_process_shutdown, worker_shutdown

from orchestrator.core.conductor import Completion, Conductor, StageResult, StageStart, StartAction
from orchestrator.core.errors import PipelineError
from orchestrator.core.execution import Held
from orchestrator.core.providers import LITELLM_PROVIDERS
from orchestrator.core.queue import STAGE_TASK, Dispatcher
from orchestrator.core.store import RunStore
from sandbox.build import EnvironmentBuildError, EnvironmentValidationError
from sandbox.environment import EnvironmentSpec
from sandbox.errors import SandboxUnavailableError
from sandbox.pool import WarmPool
from workers import metrics
from workers.app import app, settings
from workers.builder import BUILD_TASK, BuildHandoff
from workers.environments import Environments
from workers.errors import (
    ExecutionError,
    InterruptedTooOftenError,
    LeaseLostError,
    RateLimitedError,
    Retry,
    StageCancelledError,
    UnrunnableStageError,
)
from workers.execution import Execution, WorkerServices
from workers.gemini import ModelClients
from workers.governed import rate_limit_countdown
from workers.governor import Governor
from workers.heartbeat import Heartbeat, Interruptible
from workers.holding import Holding, holding
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.sandboxes import DockerSandboxes, execution_labels, remove_sandboxes

logger = logging.getLogger(__name__)

INFRASTRUCTURE_ATTEMPTS = 3
"""Executions of one stage that a failing Docker daemon (or the like) may end before it fails
the run; executions ended by a 429 or a lost worker do not count."""
INFRASTRUCTURE_BACKOFF_S = 5.0


@cache
def services() -> WorkerServices:
    """What this worker process lends its executions, made on first use in each pool process
    (after the fork: the event loop and the clients are the process's own)."""
    store = run_store()
    mirrors = RepoCache(settings.repo_cache_dir)
    return WorkerServices(
        conductor=Conductor(store, Dispatcher(app)),
        sandboxes=DockerSandboxes(
            mirrors,
            settings.sandbox_config(),
            pool=warm_pool(),
            build_timeout_s=settings.build_settings().command_timeout_s,
        ),
        environments=environments(),
        publisher=Publisher(
            mirrors, token=settings.github_token, github_api_url=settings.github_api_url
        ),
        governor=Governor(store.redis, settings.quotas, settings.default_quota),
        model=settings.model_section(),
        retry=settings.retry,
        providers={name: settings.provider_section(name) for name in LITELLM_PROVIDERS},
        streaming=settings.streaming,
        clients=ModelClients(),
        loop=asyncio.new_event_loop(),
        keep_model_requests=settings.keep_model_requests,
        environ=os.environ,  # declared tools' secrets, read by name when a stage needs them
        mirrors=mirrors,
        prices=settings.prices,
    )


@cache
def run_store() -> RunStore:
    return RunStore.from_url(settings.redis_section(), ttl_s=settings.queue.run_ttl_s)


@cache
def environments() -> Environments:
    """This process's environments: built here, or handed to the builder (`BATON_BUILD__*`)."""
    return Environments(
        run_store().redis,
        RepoCache(settings.repo_cache_dir),
        settings.build_settings(),
        sandbox_config=settings.sandbox_config(),
        handoff=BuildHandoff(app) if settings.build.handoff else None,
    )


@worker_process_shutdown.connect
@worker_shutdown.connect  # the solo and threads pools run tasks in the worker's own process
def _close_pool(**_: Any) -> None:
    """A process that ran stages is exiting: its idle sandboxes go now (else the reaper removes
    them once it sees their owner gone)."""
    if warm_pool.cache_info().currsize and (pool := warm_pool()) is not None:
        pool.close()


@cache
def warm_pool() -> WarmPool | None:
    """This process's ready sandboxes (`BATON_SANDBOX_POOL_SIZE`; 0: none)."""
    return WarmPool(size=settings.sandbox_pool_size) if settings.sandbox_pool_size else None


@app.task(name=STAGE_TASK, bind=True, max_retries=None, acks_late=True, reject_on_worker_lost=True)
def run_stage(self: Task, run_id: str, stage: str, branch: str | None = None) -> None:
    """Run `stage` of `run_id`, or one `branch` of it when the stage fans out: claimed,
    executed under a heartbeat, recorded, as `Holding` says for either."""
    svc, queue = services(), settings.queue
    owner = f"{socket.gethostname()}:{os.getpid()}:{self.request.id}"
    holder = holding(svc.conductor, Held(run_id, stage, branch), owner)
    start = holder.begin(lease_s=queue.lease_s, max_interrupted=queue.max_interrupted)
    if start.action != StartAction.RUN or start.run is None:
        _not_run(holder, start)
        return
    try:
        pipeline = svc.conductor.pipeline_of(start.run)
        spec = pipeline.stage(stage)
    except PipelineError as exc:
        error = UnrunnableStageError(f"this worker cannot run it: {exc}")
        holder.fail(error.message, figures=None)
        metrics.stage_failed(stage, error.reason)
        logger.error("stage %s of run %s: %s", holder.held, run_id, error)
        return
    execution = Execution(svc, start.run, pipeline, spec, attempt=start.attempt, holding=holder)
    interruptible = Interruptible(svc.loop)
    heartbeat = Heartbeat(holder, lease_s=queue.lease_s,
                          on_stop=lambda: _stop(execution, heartbeat, interruptible))  # fmt: skip
    with metrics.stage_timer(stage, pipeline.name) as timer:
        try:
            with heartbeat:
                out = interruptible.run(execution.execute())
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: by the heartbeat
            failure = execution.failure(exc)
            timer.settled(_settle(self, execution, failure), failure)
            return
        completion = holder.complete(StageResult(out.output, execution.figures(), out.compacted))
        if completion == Completion.CANCELLED:
            timer.settled("cancelled", StageCancelledError())
        elif completion == Completion.LOST:
            timer.settled("lost", LeaseLostError(f"another execution holds {holder.held} now"))


@app.task(name=BUILD_TASK, acks_late=True, reject_on_worker_lost=True)
def build_environment(repo: str, commit: str, spec: str | None, key: str) -> None:
    """Build the environment `key` a worker handed over (`BATON_BUILD__HANDOFF`): this process
    holds the gate's build socket. Whatever happens is recorded for the worker waiting on it."""
    made = environments()
    try:
        given = EnvironmentSpec.model_validate_json(spec) if spec else None
        made.prepare(repo, commit, spec=given)
    except (EnvironmentBuildError, EnvironmentValidationError) as exc:
        logger.info("environment %s of %s failed: %s", key, repo, exc)  # recorded by prepare
    except SandboxUnavailableError as exc:
        made.record_failure(key, repo, str(exc), retryable=True)
    except Exception as exc:  # a bad spec, a commit the builder cannot find, ...
        logger.exception("environment %s of %s could not be built", key, repo)
        made.record_failure(key, repo, f"{type(exc).__name__}: {exc}", retryable=False)


def _stop(execution: Execution, heartbeat: Heartbeat, interruptible: Interruptible) -> None:
    """The heartbeat found the execution must stop: mark it, remove its sandboxes (its own
    only, not a sibling branch's nor a later execution's), interrupt it."""
    execution.stopped_as = heartbeat.hold
    remove_sandboxes(execution_labels(execution.holding.held, execution.attempt))
    interruptible.cancel()


def _settle(task: Task, execution: Execution, error: ExecutionError) -> metrics.Outcome:
    """Record why an execution did not finish, with what it cost: cancelled, retried (raises
    Celery's `Retry`), lost, or failed with the error's message. Returns which."""
    holder, figures = execution.holding, execution.figures()
    if isinstance(error, StageCancelledError):
        holder.stopped(figures)
        return "cancelled"
    if error.retry == Retry.LOST:
        logger.info("stage %s of run %s: %s; recording nothing but its audit", holder.held,
                    execution.run.id, error)  # fmt: skip
        execution.audit.flush()
        return "lost"
    if error.retry == Retry.RATE_LIMITED:
        assert isinstance(error, RateLimitedError)
        _retry_rate_limited(task, execution, error)
    elif error.retry == Retry.INFRASTRUCTURE:
        _retry_infrastructure(task, execution, error)
    elif error.ends_run:
        holder.fail_run(error.message, figures=figures)
    else:
        holder.fail(error.message, figures=figures)
    return "failed"


def _not_run(holder: Holding, start: StageStart) -> None:
    where = f"{holder.held} of run {holder.held.run_id}"
    if start.action == StartAction.ADVANCE:
        holder.redelivered()
    elif start.action == StartAction.BUSY:
        logger.info("%s is held by a live execution; dropping this delivery", where)
    elif start.action == StartAction.EXHAUSTED:
        lost = settings.queue.max_interrupted
        error = InterruptedTooOftenError(
            f"the stage was interrupted {lost} times (its worker was lost); giving up"
        )
        holder.fail(error.message, figures=None, fenced=False)
        metrics.stage_failed(holder.held.stage, error.reason)
    else:
        logger.info("the run has ended; dropping %s", where)


def _retry_rate_limited(task: Task, execution: Execution, exc: RateLimitedError) -> None:
    """Back on the queue after the server's delay, or fail when the retry budget is spent."""
    holder, figures = execution.holding, execution.figures()
    record = holder.retries(execution.run)
    countdown = rate_limit_countdown(exc, record, execution.services.retry)
    if countdown is None:
        holder.fail(
            f"{exc} — gave up after {record.rate_limit_retries} retries and "
            f"{record.rate_limit_wait_s:.0f}s of waiting",
            figures=figures,
        )
        return
    if not holder.postpone(delay_s=countdown, reason=str(exc), rate_limited=True, figures=figures):
        return
    logger.info("stage %s of run %s rate limited; retrying in %.1fs", holder.held,
                execution.run.id, countdown)  # fmt: skip
    raise task.retry(countdown=countdown, exc=exc) from None


def _retry_infrastructure(task: Task, execution: Execution, exc: ExecutionError) -> None:
    holder, figures = execution.holding, execution.figures()
    failed = holder.retries(execution.run).infrastructure_retries + 1  # this one included
    if failed >= INFRASTRUCTURE_ATTEMPTS:
        holder.fail(f"{exc} (after {failed} attempts)", figures=figures)
        return
    countdown = INFRASTRUCTURE_BACKOFF_S * failed
    if not holder.postpone(delay_s=countdown, reason=str(exc), rate_limited=False, figures=figures):
        return
    logger.warning("stage %s of run %s: %s; retrying in %.0fs", holder.held, execution.run.id,
                   exc, countdown)  # fmt: skip
    raise task.retry(countdown=countdown, exc=exc) from None

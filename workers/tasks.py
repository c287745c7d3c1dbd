"""The one Celery task: decode the message, run the stage, record the result, declare retries.

Agent logic lives in `workers.stage`; this module only adapts it to Celery.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from dataclasses import dataclass, replace
from functools import cache

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

import sandbox
from orchestrator.conductor import Conductor, StageResult, StageStart
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import STAGE_TASK, Dispatcher
from orchestrator.store import RunStore
from workers import metrics
from workers.app import app, settings
from workers.errors import (
    InfrastructureError,
    RateLimitedError,
    StageCancelledError,
    StageError,
)
from workers.gemini import build_model, classify, close_model, rate_limit_countdown
from workers.governor import Governor
from workers.heartbeat import Heartbeat, Interruptible
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.settings import WorkerSettings
from workers.stage import StageJob, StageServices, execute_stage

logger = logging.getLogger(__name__)

INFRASTRUCTURE_ATTEMPTS = 3
"""Executions of one stage that a failing Docker daemon (or the like) may end before it fails
the run; executions ended by a 429 or a lost worker do not count."""
INFRASTRUCTURE_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Runtime:
    """Per-process state of a worker, made on first use in each pool process."""

    settings: WorkerSettings
    conductor: Conductor
    services: StageServices
    governor: Governor


@cache
def runtime() -> Runtime:
    store = RunStore.from_url(settings.require_redis_url(), ttl_s=settings.queue.run_ttl_s)
    repos = RepoCache(settings.repo_cache_dir)
    services = StageServices(
        store=store,
        repos=repos,
        sandbox=settings.sandbox_config(),
        publisher=Publisher(
            repos, token=settings.github_token, github_api_url=settings.github_api_url
        ),
    )
    governor = Governor(store.redis, settings.quotas, settings.default_quota)
    return Runtime(settings, Conductor(store, Dispatcher(app)), services, governor)


@app.task(name=STAGE_TASK, bind=True, max_retries=None, acks_late=True, reject_on_worker_lost=True)
def run_stage(self: Task, run_id: str, stage: str) -> None:
    rt = runtime()
    queue = rt.settings.queue
    owner = f"{socket.gethostname()}:{os.getpid()}:{self.request.id}"
    start = rt.conductor.begin(
        run_id, stage, owner=owner, lease_s=queue.lease_s, max_interrupted=queue.max_interrupted
    )
    if start.action != "run" or start.run is None:
        _not_run(rt, start, run_id, stage, owner)
        return
    pipeline = load_pipeline(start.run.pipeline)
    job = StageJob(start.run, pipeline, pipeline.stage(stage), start.attempt, owner)
    execution = Interruptible()

    def stop() -> None:
        _stop_sandboxes(run_id, stage)
        execution.cancel()

    heartbeat = Heartbeat(
        rt.conductor, run_id, stage, owner=owner, lease_s=queue.lease_s, on_cancel=stop
    )
    with metrics.stage_timer(stage, pipeline.name) as timer:
        try:
            with heartbeat:
                result = execution.run(_execute(job, rt, heartbeat.cancelled))
        except (Exception, asyncio.CancelledError) as exc:
            timer.settled(_settle(self, rt, job, exc, cancelled=heartbeat.cancelled.is_set()), exc)
        else:
            rt.conductor.complete(run_id, stage, result)


def _settle(
    task: Task, rt: Runtime, job: StageJob, exc: BaseException, *, cancelled: bool
) -> metrics.Outcome:
    """Record why a stage did not finish: cancelled, retried (raises `Retry`), or failed with a
    reason. Returns which."""
    run_id, stage, owner = job.run.id, job.spec.name, job.owner
    if cancelled or isinstance(exc, StageCancelledError):
        rt.conductor.stopped(run_id, stage, owner=owner)
        return "cancelled"
    if isinstance(exc, RateLimitedError):
        _retry_rate_limited(task, rt, job, exc)
    elif isinstance(exc, InfrastructureError):
        _retry_infrastructure(task, rt, job, exc)
    elif isinstance(exc, StageError):
        rt.conductor.fail(run_id, stage, str(exc), owner=owner)
    elif isinstance(exc, SoftTimeLimitExceeded):
        limit = job.spec.budget.soft_time_limit_s
        rt.conductor.fail(
            run_id, stage, f"stage exceeded its soft time limit of {limit}s", owner=owner
        )
    else:
        logger.error("stage %s of run %s crashed", stage, run_id, exc_info=exc)
        rt.conductor.fail(
            run_id, stage, f"internal error: {type(exc).__name__}: {exc}", owner=owner
        )
    return "failed"


def _not_run(rt: Runtime, start: StageStart, run_id: str, stage: str, owner: str) -> None:
    if start.action == "advance":
        logger.info("stage %s of run %s already recorded; only advancing", stage, run_id)
        rt.conductor.advance(run_id, stage)
    elif start.action == "busy":
        logger.info(
            "stage %s of run %s is held by a live execution; dropping this delivery", stage, run_id
        )
    elif start.action == "exhausted":
        lost = rt.settings.queue.max_interrupted
        rt.conductor.fail(
            run_id,
            stage,
            f"the stage was interrupted {lost} times (its worker was lost); giving up",
        )
        metrics.stage_failed(stage, "lost")
    else:
        logger.info("run %s has ended; dropping stage %s", run_id, stage)


def _stop_sandboxes(run_id: str, stage: str) -> None:
    try:
        sandbox.remove_labelled({"baton.run": run_id, "baton.stage": stage})
    except sandbox.SandboxError as exc:
        logger.warning("could not remove the sandboxes of cancelled %s: %s", stage, exc)


def _retry_rate_limited(task: Task, rt: Runtime, job: StageJob, exc: RateLimitedError) -> None:
    """Back on the queue after the server's delay, or fail when the retry budget is spent."""
    record = job.run.stages[job.spec.name]
    countdown = rate_limit_countdown(exc, record, rt.settings.retry)
    if countdown is None:
        rt.conductor.fail(
            job.run.id,
            job.spec.name,
            f"{exc} — gave up after {record.rate_limit_retries} retries and "
            f"{record.rate_limit_wait_s:.0f}s of waiting",
            owner=job.owner,
        )
        return
    if not rt.conductor.wait(
        job.run.id, job.spec.name, delay_s=countdown, reason=str(exc), owner=job.owner
    ):
        return
    logger.info(
        "stage %s of run %s rate limited; retrying in %.1fs", job.spec.name, job.run.id, countdown
    )
    raise task.retry(countdown=countdown, exc=exc) from None


def _retry_infrastructure(task: Task, rt: Runtime, job: StageJob, exc: InfrastructureError) -> None:
    failed = job.run.stages[job.spec.name].infrastructure_retries + 1  # this one included
    if failed >= INFRASTRUCTURE_ATTEMPTS:
        reason = f"{exc} (after {failed} attempts)"
        rt.conductor.fail(job.run.id, job.spec.name, reason, owner=job.owner)
        return
    countdown = INFRASTRUCTURE_BACKOFF_S * failed
    if not rt.conductor.wait(
        job.run.id, job.spec.name, delay_s=countdown, reason=str(exc), rate_limited=False,
        owner=job.owner,
    ):  # fmt: skip
        return
    logger.warning(
        "stage %s of run %s: %s; retrying in %.0fs", job.spec.name, job.run.id, exc, countdown
    )
    raise task.retry(countdown=countdown, exc=exc) from None


async def _execute(job: StageJob, rt: Runtime, cancelled: threading.Event) -> StageResult:
    model = build_model(
        rt.settings.model_section(),
        rt.settings.retry,
        governor=rt.governor,
        on_wait=lambda seconds, why: rt.conductor.waiting(job.run.id, job.spec.name, seconds, why),
        stage=job.spec.name,
    )
    try:
        result = await execute_stage(
            job, rt.services, model=model, streaming=rt.settings.streaming, cancelled=cancelled
        )
        return replace(result, quota_wait_s=round(model.waited_s, 3))
    except sandbox.SandboxUnavailableError as exc:
        raise InfrastructureError(f"the sandbox failed: {exc}") from exc
    except sandbox.SandboxStartError as exc:
        raise StageError(f"no sandbox could be started: {exc}") from exc
    except Exception as exc:
        mapped = classify(exc)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        await close_model(model)

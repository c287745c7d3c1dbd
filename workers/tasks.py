"""The one Celery task: decode the message, run the stage, record the result, declare retries.

Agent logic lives in `workers.stage`; this module only adapts it to Celery.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import cache

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from orchestrator.conductor import Conductor, StageResult
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import STAGE_TASK, Dispatcher
from orchestrator.settings import Settings
from orchestrator.store import RunStore
from workers.app import app, settings
from workers.errors import RateLimitedError, StageError
from workers.gemini import build_model, classify, close_model, rate_limit_countdown
from workers.repos import RepoCache
from workers.stage import StageJob, execute_stage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    """Per-process state of a worker, made on first use in each pool process."""

    settings: Settings
    store: RunStore
    conductor: Conductor
    repos: RepoCache


@cache
def runtime() -> Runtime:
    store = RunStore.from_url(settings.require_redis_url(), ttl_s=settings.queue.run_ttl_s)
    dispatcher = Dispatcher(app)
    return Runtime(
        settings, store, Conductor(store, dispatcher), RepoCache(settings.repo_cache_dir)
    )


@app.task(name=STAGE_TASK, bind=True, max_retries=None, acks_late=True, reject_on_worker_lost=True)
def run_stage(self: Task, run_id: str, stage: str) -> None:
    rt = runtime()
    start = rt.conductor.begin(run_id, stage, task_id=self.request.id)
    if start.action == "drop":
        logger.info("run %s has ended; dropping stage %s", run_id, stage)
        return
    if start.action == "advance":
        logger.info("stage %s of run %s already recorded; only advancing", stage, run_id)
        rt.conductor.advance(run_id, stage)
        return
    assert start.run is not None
    pipeline = load_pipeline(start.run.pipeline)
    job = StageJob(
        run=start.run, pipeline=pipeline, spec=pipeline.stage(stage), attempt=start.attempt
    )
    try:
        result = asyncio.run(_execute(job, rt))
    except RateLimitedError as exc:
        record = start.run.stages[stage]
        countdown = rate_limit_countdown(exc, record, rt.settings.retry)
        if countdown is None:
            rt.conductor.fail(
                run_id,
                stage,
                f"{exc} — gave up after {record.rate_limit_retries} "
                f"retries and {record.rate_limit_wait_s:.0f}s of waiting",
            )
            return
        rt.conductor.wait(run_id, stage, delay_s=countdown, reason=str(exc))
        logger.info("stage %s of run %s rate limited; retrying in %.1fs", stage, run_id, countdown)
        raise self.retry(countdown=countdown, exc=exc) from None
    except StageError as exc:
        rt.conductor.fail(run_id, stage, str(exc))
        return
    except SoftTimeLimitExceeded:
        limit = job.spec.budget.soft_time_limit_s
        rt.conductor.fail(run_id, stage, f"stage exceeded its soft time limit of {limit}s")
        return
    except Exception as exc:
        logger.exception("stage %s of run %s crashed", stage, run_id)
        rt.conductor.fail(run_id, stage, f"internal error: {type(exc).__name__}: {exc}")
        return
    rt.conductor.complete(run_id, stage, result)


async def _execute(job: StageJob, rt: Runtime) -> StageResult:
    model = build_model(rt.settings.model_section(), rt.settings.retry)
    try:
        return await execute_stage(
            job, store=rt.store, model=model, repos=rt.repos, streaming=rt.settings.streaming
        )
    except Exception as exc:
        mapped = classify(exc)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        await close_model(model)

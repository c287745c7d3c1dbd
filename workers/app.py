"""The Celery app of a worker process (`celery -A workers.app worker`, or `baton worker`).

This module is an entry point: it reads `Settings` once, here.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_ready

import sandbox
from orchestrator.queue import celery_config
from workers.settings import WorkerSettings

logger = logging.getLogger(__name__)


def create_app(settings: WorkerSettings) -> Celery:
    app = Celery("baton", include=["workers.tasks"])
    app.conf.update(celery_config(settings.require_redis_url(), settings.queue))
    return app


@worker_ready.connect
def _reap_leftover_sandboxes(**_: Any) -> None:
    """Containers a crashed worker left behind go as soon as a worker on this host starts."""
    try:
        removed = sandbox.reap()
    except sandbox.SandboxError as exc:
        logger.warning("could not look for leftover sandboxes: %s", exc)
        return
    if removed:
        logger.info("removed %d leftover sandboxes", len(removed))


settings = WorkerSettings()
app = create_app(settings)

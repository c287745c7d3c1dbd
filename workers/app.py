"""The Celery app of a worker process (`celery -A workers.app worker`, or `baton worker`).

This module is an entry point: it reads `Settings` once, here.
"""

from __future__ import annotations

from celery import Celery

from orchestrator.queue import celery_config
from orchestrator.settings import Settings


def create_app(settings: Settings) -> Celery:
    app = Celery("baton", include=["workers.tasks"])
    app.conf.update(celery_config(settings.require_redis_url(), settings.queue))
    return app


settings = Settings()
app = create_app(settings)

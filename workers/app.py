"""The Celery app of a worker process (`celery -A workers.app worker`, or `baton worker`).

This module is an entry point: it reads `Settings` once, here. When the worker is ready, its
main process removes sandboxes a crashed worker left behind and starts the fleet's
housekeeping thread: now and then (one worker at a time, under a Redis lock) it reconciles
stuck runs and reaps orphaned sandboxes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

import sandbox
from orchestrator.conductor import Conductor
from orchestrator.queue import Dispatcher, celery_config
from orchestrator.reconciler import Reconciler
from orchestrator.store import RunStore
from workers.settings import WorkerSettings

logger = logging.getLogger(__name__)

_stop_housekeeping = threading.Event()


def create_app(settings: WorkerSettings) -> Celery:
    app = Celery("baton", include=["workers.tasks"])
    app.conf.update(celery_config(settings.require_redis_url(), settings.queue))
    return app


@worker_ready.connect
def _start_housekeeping(**_: Any) -> None:
    _touch_health_file()
    _reap()
    thread = threading.Thread(target=_housekeeping, name="baton-housekeeping", daemon=True)
    thread.start()


@worker_shutdown.connect
def _stop(**_: Any) -> None:
    _stop_housekeeping.set()


def _housekeeping() -> None:
    """Reconcile stuck runs at once and every `reconcile_every_s`; reap sandboxes too."""
    store = RunStore.from_url(settings.require_redis_url(), ttl_s=settings.queue.run_ttl_s)
    reconciler = Reconciler(Conductor(store, Dispatcher(app)), settings.queue)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    while True:
        try:
            reconciler.sweep_if_due(holder=holder)
        except Exception:
            logger.warning("reconciling stuck runs failed; trying again later", exc_info=True)
        if _stop_housekeeping.wait(settings.queue.reconcile_every_s):
            return
        _touch_health_file()
        _reap()


def _touch_health_file() -> None:
    if settings.health_file is not None:
        settings.health_file.parent.mkdir(parents=True, exist_ok=True)
        settings.health_file.touch()


def _reap() -> None:
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

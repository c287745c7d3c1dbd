"""The Celery app of a worker process (`celery -A workers.app worker`, or `baton worker`).

This module is an entry point: it reads `Settings` once, here. When the worker is ready, its
main process removes sandboxes a crashed worker left behind and starts the fleet's
housekeeping thread: now and then (one worker at a time, under a Redis lock) it reconciles
stuck runs and reaps orphaned sandboxes, and every pass it announces the queues this worker
serves (`orchestrator.core.serving`: `baton top`, `status` and the web UI tell a queue no
worker serves). Every heartbeat the consumer sends (2 s) touches
`BATON_HEALTH_FILE` while that thread lives: the probes' file is fresh only while the loop that
takes tasks runs, is connected to Redis and housekeeping goes on. With `BATON_METRICS_PORT`,
the main process also serves the Prometheus metrics of all its pool processes
(`workers.metrics`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import Celery
from celery.signals import (
    celeryd_init,
    heartbeat_sent,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

import sandbox
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import ConfigError
from orchestrator.core.queue import Dispatcher, celery_app, collect_less
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.serving import announce, withdraw
from orchestrator.core.store import RunStore
from workers import metrics
from workers.builder import BUILD_QUEUE_PREFIX
from workers.gemini import missing_key_message
from workers.settings import WorkerSettings

logger = logging.getLogger(__name__)

_stop_housekeeping = threading.Event()
_housekeeper: threading.Thread | None = None
_reap_failed = False
_served: tuple[str, list[str]] | None = None
"""This worker's name and the stage queues it consumes, once it is ready."""
ANNOUNCED_PASSES = 3
"""An announcement of the queues a worker serves lasts this many housekeeping passes."""


def create_app(settings: WorkerSettings) -> Celery:
    """The worker's Celery app. It can be made (and this module imported) without a usable
    `BATON_REDIS_URL`; a worker refuses to start without one, saying why (`_require_redis`)."""
    try:
        redis = settings.redis_section()
    except ConfigError:
        redis = None
    return celery_app("baton", redis, settings.queue, include=["workers.tasks"])


@celeryd_init.connect
def _require_redis(**_: Any) -> None:
    """A worker without a broker stops at once, saying why (SystemExit: Celery's signal
    dispatch would only log an ordinary exception)."""
    try:
        settings.require_redis_url()
    except ConfigError as exc:
        raise SystemExit(f"baton worker: {exc}") from None


@celeryd_init.connect
def _prepare_metrics(**_: Any) -> None:
    """Before the pool forks, so that every pool process writes its metrics to files."""
    if settings.metrics_port is not None:
        metrics.prepare(settings.metrics_dir)


@worker_ready.connect
def _serve_metrics(**_: Any) -> None:
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port)


worker_process_init.connect(collect_less, weak=False)


@worker_process_shutdown.connect
def _process_exited(pid: int, **_: Any) -> None:
    metrics.process_exited(pid)


@worker_ready.connect
def _say_what_is_missing(sender: Any = None, **_: Any) -> None:
    """Said once, when the worker starts, rather than in the reason of every run it fails (an
    environment builder calls no model)."""
    queues = set(getattr(sender.app.amqp.queues, "consume_from", None) or ()) if sender else set()
    builder = bool(queues) and all(q.startswith(BUILD_QUEUE_PREFIX) for q in queues)
    if settings.google_api_key is None and not builder:
        logger.error(
            "%s; every stage will fail until it is set",
            missing_key_message(settings.model_section()),
        )


@worker_ready.connect
def _start_housekeeping(sender: Any = None, **_: Any) -> None:
    global _housekeeper, _served
    if sender is not None:
        consumed = getattr(sender.app.amqp.queues, "consume_from", None) or {}
        _served = (sender.hostname, sorted(consumed))
    _touch_health_file()
    _reap()
    _housekeeper = threading.Thread(target=_housekeeping, name="baton-housekeeping", daemon=True)
    _housekeeper.start()


@heartbeat_sent.connect
def _consumer_alive(**_: Any) -> None:
    """Sent from the consumer's event loop, and only while it is connected to the broker (a
    lost connection stops the heartbeats until it is back)."""
    if _housekeeper is not None and _housekeeper.is_alive():
        _touch_health_file()


@worker_shutdown.connect
def _stop(**_: Any) -> None:
    _stop_housekeeping.set()
    if _housekeeper is not None:
        _housekeeper.join(timeout=5)
    metrics.close()


def _housekeeping() -> None:
    """Reconcile stuck runs at once and every `reconcile_every_s`; reap sandboxes too."""
    store = RunStore.from_url(settings.redis_section(), ttl_s=settings.queue.run_ttl_s)
    reconciler = Reconciler(Conductor(store, Dispatcher(app)), settings.queue)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    ttl_s = settings.queue.reconcile_every_s * ANNOUNCED_PASSES
    while True:
        if _served is not None:
            try:
                announce(store.redis, *_served, ttl_s=ttl_s)
            except Exception:
                logger.warning("could not announce the queues served; trying again later",
                               exc_info=True)  # fmt: skip
        try:
            reconciler.sweep_if_due(holder=holder)
        except Exception:
            logger.warning("reconciling stuck runs failed; trying again later", exc_info=True)
        if _stop_housekeeping.wait(settings.queue.reconcile_every_s):
            break
        _reap()
    if _served is not None:
        try:
            withdraw(store.redis, *_served)
        except Exception:
            logger.info("could not withdraw the queues served", exc_info=True)


def _touch_health_file() -> None:
    if settings.health_file is not None:
        settings.health_file.parent.mkdir(parents=True, exist_ok=True)
        settings.health_file.touch()


def _reap() -> None:
    """Containers a crashed worker left behind go as soon as a worker on this host starts.

    A worker of tool-less stages may have no Docker daemon at all: that is said once, at
    WARNING, and afterwards only at DEBUG."""
    global _reap_failed
    try:
        removed = sandbox.reap()
    except sandbox.SandboxError as exc:
        logger.log(logging.DEBUG if _reap_failed else logging.WARNING,
                   "could not look for leftover sandboxes: %s", exc)  # fmt: skip
        _reap_failed = True
        return
    if removed:
        logger.info("removed %d leftover sandboxes", len(removed))


settings = WorkerSettings()
app = create_app(settings)

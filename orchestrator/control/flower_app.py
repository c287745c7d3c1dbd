"""The Celery app Flower loads (`celery -A orchestrator.control.flower_app flower`, which `baton
flower` runs): Baton's broker, with its TLS options, and no tasks.

This module is an entry point: it reads `Settings` once, here. Flower needs the app for the
broker's TLS options (`broker_use_ssl`, which no URL or variable of Celery's carries) and for
Baton's queue names on its broker page. Its consumers (Celery events, the replies to its
inspections) do not acknowledge through Redis (`acks=False`), so Flower's Redis user needs no
write access to the stage queues (k8s/baton/redis-users.acl). The module imports without a
usable `BATON_REDIS_URL` (its app then has no broker); `baton flower` refuses to start Flower
without one, saying why.
"""

from __future__ import annotations

from orchestrator.core.connection import RedisConfig
from orchestrator.core.errors import ConfigError
from orchestrator.core.queue import celery_app
from orchestrator.core.settings import Settings


def _broker(settings: Settings) -> RedisConfig | None:
    try:
        return settings.redis_section()
    except ConfigError:
        return None


settings = Settings()
app = celery_app("baton-flower", _broker(settings), settings.queue, acks=False)
# Kombu's own Redis transport, not Baton's (`orchestrator.core.queue.RedisTransport`, a faster
# publisher): Flower's broker page picks its Redis client by the broker URL's scheme, which a
# transport given by import path would make unknown to it.
app.conf.broker_transport = "redis"

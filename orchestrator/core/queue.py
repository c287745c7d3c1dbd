"""Celery configuration and the sending side: the orchestrator enqueues stages by task name.

The orchestrator never imports `workers`; it only knows the task's name and the queues.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from celery import Celery
from celery.app.amqp import AMQP
from kombu.transport import redis as kombu_redis

from orchestrator.core.connection import RedisConfig
from orchestrator.core.errors import ConfigError
from orchestrator.core.pipeline import QUEUE_PREFIX, Pipeline, StageSpec
from orchestrator.core.settings import QueueConfig, RetryConfig

STAGE_TASK = "baton.run_stage"
"""Name of the one Celery task that runs any stage; routed by queue."""


def task_name(pipeline: str, stage: str) -> str:
    """The name Flower, the workers' logs and task events show for a stage's task (a shadow name
    of `STAGE_TASK`): `baton.<pipeline>.<stage>`."""
    return f"baton.{pipeline}.{stage}"


def stage_task_id(run_id: str, stage: str, iteration: int = 1) -> str:
    """Deterministic task id of a stage of a run, `<run>.<stage>`, and `<run>.<stage>.<n>` for
    a looped stage's iteration n > 1: redeliveries and retries keep it."""
    return f"{run_id}.{stage}" if iteration <= 1 else f"{run_id}.{stage}.{iteration}"


class _PublishingChannel(kombu_redis.Channel):
    """A channel of kombu's Redis transport that publishes through one Redis client of its own.

    Kombu makes a new `redis.Redis` for every message it publishes (`conn_or_acquire`), and
    redis-py builds its whole table of reply handlers for each, on every stage sent and every task
    event. A client only borrows connections from the channel's pool, so one per channel serves
    every publish (from any thread).
    """

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._publishing_client

    @cached_property
    def _publishing_client(self) -> Any:
        return self._create_client()


class RedisTransport(kombu_redis.Transport):
    """Kombu's Redis transport, its channels publishing through a client each
    (`_PublishingChannel`); Celery's `broker_transport` names it."""

    Channel = _PublishingChannel


TRANSPORT = f"{RedisTransport.__module__}:{RedisTransport.__qualname__}"
"""`broker_transport` of every Baton app: the Redis broker, through `RedisTransport`."""


YOUNG_COLLECTION_EVERY = 20_000
"""Allocations (net of frees) between collections of the youngest generation in a worker's pool
process (CPython's default: 700)."""


def collect_less(**_: Any) -> None:
    """For Celery's `worker_process_init`, in a pool process right after the fork: what the
    parent imported (ADK, google-genai, their pydantic models: most of the heap, alive until
    the process ends) is moved out of the collector's sight, and young objects are collected
    every `YOUNG_COLLECTION_EVERY` allocations. A task allocates many short-lived objects; with
    CPython's defaults young collections run far more often, and the older generations' walk
    the heap inherited from the parent too (what a stage's CPU goes to: docs/benchmarks.md,
    orchestration overhead)."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


def celery_config(
    redis: RedisConfig | str | None, queue: QueueConfig, *, acks: bool = True
) -> dict[str, Any]:
    """Settings that keep stages from being lost or run twice (shared/notes/celery-flower.md),
    on the broker `redis` (a URL alone: no CA file). With `acks` False, what this app consumes
    (a monitor's events, the replies to its broadcasts) is not acknowledged through Redis: a
    consumer that acknowledges also puts back every message a dead worker held, which takes
    write access to the stage queues that only workers have (k8s/baton/redis-users.acl)."""
    if isinstance(redis, str):
        redis = RedisConfig(url=redis)
    transport: dict[str, Any] = {"visibility_timeout": queue.visibility_timeout_s}
    if not acks:
        transport["ack_emulation"] = False
    return {
        "broker_url": redis.url if redis else None,
        "broker_use_ssl": redis.broker_ssl() if redis else None,
        "broker_transport": TRANSPORT,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "visibility_timeout": queue.visibility_timeout_s,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "worker_prefetch_multiplier": 1,
        # Take a message only with a process free to run it, and hold at most a few countdown
        # retries on top (celery-flower.md, §2): what waits stays in the queue, where other
        # workers and KEDA see it.
        "worker_disable_prefetch": True,
        "worker_eta_task_limit": queue.eta_task_limit,
        # A task that loses its broker connection finishes its stage; the redelivered message
        # then only advances the run (Conductor.begin), so cancelling it would only waste work.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_publish_retry_policy": {
            "max_retries": 20,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        "worker_hijack_root_logger": False,
        "task_default_queue": "baton.default",
    }


def _decoded(raw: bytes | str) -> Any:
    """A broker entry as JSON; None for one that is not (never Baton's)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _task_id(message: Any) -> str | None:
    headers = message.get("headers") if isinstance(message, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None


class ShadowNamedAMQP(AMQP):
    """Celery's messaging, except that a task's `task-sent` event carries its shadow name.

    The worker's events name a task by its shadow (`baton.fix`), but Celery's sent event names
    it `baton.run_stage` (celery/celery#4347, fixed for the message only), and a monitor keeps
    the name of whichever event it merged last: Flower showed one or the other at random.
    """

    def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(*args, **kwargs)
        shadow = message.headers.get("shadow")
        if shadow and message.sent_event is not None:
            message.sent_event["name"] = shadow
        return message


def celery_app(
    name: str,
    redis: RedisConfig | str | None,
    queue: QueueConfig,
    *,
    acks: bool = True,
    **kwargs: Any,
) -> Celery:
    """A Celery app configured for Baton, a worker's (`acks`) or a sender's or monitor's (no
    broker yet without `redis`)."""
    app = Celery(name, amqp=ShadowNamedAMQP, **kwargs)
    app.conf.update(celery_config(redis, queue, acks=acks))
    return app


def check_time_limits(pipeline: Pipeline, queue: QueueConfig, retry: RetryConfig) -> None:
    """Every stage's hard time limit plus the longest 429 countdown must stay below the Redis
    visibility timeout; otherwise a second worker would take a stage that is still running.

    Raises:
        ConfigError: naming the stage and the numbers.
    """
    for stage in pipeline.stages:
        worst_s = stage.budget.time_limit_s + retry.rate_limit_max_wait_s
        if worst_s >= queue.visibility_timeout_s:
            raise ConfigError(
                f"stage {stage.name!r}: time_limit_s {stage.budget.time_limit_s} + "
                f"rate_limit_max_wait_s {retry.rate_limit_max_wait_s:g} = {worst_s:g}s is not "
                f"below the visibility timeout of {queue.visibility_timeout_s}s"
            )


class Dispatcher:
    """Sends stage tasks to their queues, through a Celery app it is given or makes."""

    def __init__(self, app: Celery, *, owned: bool = False) -> None:
        self.app = app
        self._owned = owned

    @classmethod
    def connect(cls, redis: RedisConfig | str, queue: QueueConfig) -> Dispatcher:
        """A dispatcher with an app of its own (closed by `close`), which sends and inspects
        but never consumes stages."""
        app = celery_app("baton-orchestrator", redis, queue, acks=False, set_as_current=False)
        return cls(app, owned=True)

    def send_stage(self, run_id: str, pipeline: str, stage: StageSpec, iteration: int = 1) -> str:
        """Send `stage` of a run of the pipeline named `pipeline` to the stage's queue; returns
        the task id."""
        task_id = stage_task_id(run_id, stage.name, iteration)
        self.app.send_task(
            STAGE_TASK,
            args=[run_id, stage.name],
            queue=stage.queue,
            task_id=task_id,
            shadow=task_name(pipeline, stage.name),
            soft_time_limit=stage.budget.soft_time_limit_s,
            time_limit=stage.budget.time_limit_s,
        )
        return task_id

    def held_task_ids(self, *, delivered_within_s: float) -> dict[str, str]:
        """The tasks the broker still has, read in one pass, by id, each with its queue:
        waiting in a stage queue, or delivered to a worker at most `delivered_within_s` ago and
        not yet acknowledged. (Celery's Redis transport keeps delivered messages in `unacked`,
        scored in `unacked_index` by delivery time; one delivered long ago to a stage that
        never began was taken by a worker that died.)"""
        held: list[tuple[Any, str]] = []
        with self.app.connection_for_write() as connection:
            client = connection.default_channel.client
            for queue in client.scan_iter(match=f"{QUEUE_PREFIX}*", _type="list"):
                name = queue.decode() if isinstance(queue, bytes) else queue
                held += [(_decoded(raw), name) for raw in client.lrange(queue, 0, -1)]
            recent = client.zrangebyscore("unacked_index", time.time() - delivered_within_s, "+inf")
            if recent:  # each an array: message, exchange, routing key
                delivered = (_decoded(raw) for raw in client.hmget("unacked", recent) if raw)
                held += [
                    (entry[0], _text(entry[2]) if len(entry) > 2 else "")
                    for entry in delivered
                    if isinstance(entry, list) and entry
                ]
        return {
            task_id: queue for message, queue in held if (task_id := _task_id(message)) is not None
        }

    def close(self) -> None:
        if self._owned:
            self.app.close()

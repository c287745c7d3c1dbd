"""What `orchestrator.core.queue` relies on in Celery and kombu beyond their public API, pinned:
each test fails when an upgrade changes a signature or a behaviour Baton's subclasses and raw reads
depend on (docs/upstream.md lists them). requirements.lock pins the versions they passed with.

- `_PublishingChannel` overrides kombu's `Channel.conn_or_acquire` and calls its private
  `_create_client()`: kombu must still route every Redis command of a channel through
  `conn_or_acquire`, and `_create_client()` must still make a client of the channel's own
  (synchronous) pool. Its reason, kombu making a client per message, is pinned too: when kombu
  stops doing that, the override can go.
- `ShadowNamedAMQP` overrides Celery's `AMQP.as_task_v2`: Celery must still build protocol-2
  messages with it and send the `task-sent` event from the message's `sent_event`, and still
  name that event after the task rather than its shadow (celery/celery#4347) — else the
  override can go.
- `Dispatcher.held_task_ids` and `baton top` read kombu's Redis layout: a queue is a list named
  after it, holding JSON messages with their Celery headers; a delivered, unacknowledged message
  is in the hash `unacked` as `[message, exchange, routing key]` under its delivery tag, scored by
  delivery time in `unacked_index`.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.amqp import AMQP
from kombu.transport import redis as kombu_redis

from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import (
    STAGE_TASK,
    Dispatcher,
    RedisTransport,
    ShadowNamedAMQP,
    _PublishingChannel,
    celery_app,
)
from orchestrator.core.settings import QueueConfig

FIX = next(s for s in load_pipeline("fixer").stages if s.name == "fix")
RUN = "20261202-000000-abcdef"


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


def test_kombu_still_has_the_channel_methods_baton_overrides_and_calls() -> None:
    empty = inspect.Parameter.empty
    assert parameters(kombu_redis.Channel.conn_or_acquire) == [("self", empty), ("client", None)]
    assert parameters(_PublishingChannel.conn_or_acquire) == [("self", empty), ("client", None)]
    assert parameters(kombu_redis.Channel._create_client) == [
        ("self", empty),
        ("asynchronous", False),
    ]
    assert kombu_redis.Transport.Channel is kombu_redis.Channel  # what RedisTransport replaces


def test_celery_still_builds_protocol_2_messages_with_as_task_v2() -> None:
    app = celery_app("pin", "memory://", QueueConfig(), set_as_current=False)
    assert app.conf.task_protocol == 2
    assert isinstance(app.amqp, ShadowNamedAMQP)
    assert app.amqp.create_task_message.__func__ is ShadowNamedAMQP.as_task_v2
    names = [name for name, _ in parameters(AMQP.as_task_v2)]
    assert names[:3] == ["self", "task_id", "name"]
    assert {"shadow", "create_sent_event"} <= set(names)


def test_celery_still_names_the_sent_event_after_the_task_not_its_shadow() -> None:
    """celery/celery#4347: the reason for `ShadowNamedAMQP`. When this fails, Celery names the
    event by its shadow itself, and the override can go."""
    app = Celery("pin", set_as_current=False)
    message = AMQP(app).as_task_v2(
        "t1", STAGE_TASK, args=[RUN, "fix"], shadow="baton.fixer.fix", create_sent_event=True
    )
    assert message._fields == ("headers", "properties", "body", "sent_event")
    assert message.headers["shadow"] == "baton.fixer.fix"
    assert message.sent_event["name"] == STAGE_TASK


@pytest.fixture
def app(unit_redis_url: str) -> Iterator[Celery]:
    app = celery_app("pin", unit_redis_url, QueueConfig(), set_as_current=False)
    yield app
    app.close()


def test_a_channel_of_batons_transport_publishes_through_one_client_of_its_own_pool(
    app: Celery,
) -> None:
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert isinstance(channel, _PublishingChannel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        assert isinstance(first, redis.Redis)
        assert first.connection_pool is channel.pool  # not the pool of its BRPOP client
        assert first.connection_pool is not channel.client.connection_pool
        given = redis.Redis(connection_pool=channel.pool)
        with channel.conn_or_acquire(given) as used:
            assert used is given


def constructed_clients(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every `redis.Redis` made from now on."""
    made: list[object] = []
    init = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return made


def clients_made_sending_five(app: Celery, transport: type, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many `redis.Redis` clients sending five stages makes, once the first has set up the
    channel, its pools and clients."""
    app.conf.broker_transport = f"{transport.__module__}:{transport.__qualname__}"
    dispatcher = Dispatcher(app)
    dispatcher.send_stage(RUN, "fixer", FIX)
    made = constructed_clients(monkeypatch)
    for iteration in range(2, 7):
        dispatcher.send_stage(RUN, "fixer", FIX, iteration)
    return len(made)


def test_batons_transport_sends_stages_without_making_a_client(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert clients_made_sending_five(app, RedisTransport, monkeypatch) == 0


def test_kombus_own_transport_still_makes_a_client_for_every_message(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason for `_PublishingChannel` (each stage's message and its task-sent event): when
    this fails, kombu reuses its clients itself, and the override can go."""
    assert clients_made_sending_five(app, kombu_redis.Transport, monkeypatch) >= 5


def test_kombu_keeps_queued_and_delivered_messages_where_baton_reads_them(
    app: Celery, redis_client: redis.Redis
) -> None:
    dispatcher = Dispatcher(app)
    task_id = dispatcher.send_stage(RUN, "fixer", FIX)
    [raw] = redis_client.lrange(FIX.queue, 0, -1)
    assert json.loads(raw)["headers"]["id"] == task_id

    with app.connection_for_read() as connection:
        before = time.time()
        delivered = connection.default_channel.basic_get(FIX.queue, no_ack=False)
        after = time.time()
        assert delivered is not None
        tag = delivered.delivery_tag

        assert redis_client.llen(FIX.queue) == 0
        message, _exchange, routing_key = json.loads(redis_client.hget("unacked", tag) or "")
        assert (message["headers"]["id"], routing_key) == (task_id, FIX.queue)
        assert before - 1 <= (redis_client.zscore("unacked_index", tag) or 0) <= after + 1
        assert dispatcher.held_task_ids(delivered_within_s=60) == {task_id: FIX.queue}
        delivered.ack()
    assert dispatcher.held_task_ids(delivered_within_s=60) == {}


def test_the_task_sent_event_celery_publishes_carries_the_stage_name(app: Celery) -> None:
    """End to end over Redis: Celery sends the message's `sent_event` as the `task-sent` event,
    so the shadow name `ShadowNamedAMQP` puts there is what a monitor (Flower) sees."""
    received: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:

        def on_sent(event: dict[str, Any]) -> None:
            received.append(event)
            receiver.should_stop = True

        receiver = app.events.Receiver(connection, handlers={"task-sent": on_sent})
        listening = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": 10, "wakeup": False}
        )
        listening.start()
        dispatcher = Dispatcher(app)
        sent: list[str] = []
        while not received and listening.is_alive():  # until the receiver's queue is bound
            sent.append(dispatcher.send_stage(RUN, "fixer", FIX, len(sent) + 1))
            time.sleep(0.1)
        listening.join(timeout=15)
    assert received, "no task-sent event arrived within 10 s"
    assert received[0]["name"] == "baton.fixer.fix"
    assert received[0]["uuid"] in sent

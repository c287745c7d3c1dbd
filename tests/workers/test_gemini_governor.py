"""`BatonGemini` with the fleet's governor: permits before calls, real token counts after, and
429s that cool the fleet down, against the fake server through the real google-genai client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from google.adk.models.llm_request import LlmRequest
from google.genai import errors, types
from pydantic import SecretStr

from orchestrator.core import keys
from orchestrator.core.settings import ModelConfig, QuotaConfig, RetryConfig
from testkit.gemini import FakeGemini
from workers.errors import QuotaWaitError, RateLimitedError
from workers.gemini import BatonGemini, build_model, close_model, model_error
from workers.governor import Governor

MODEL = "gemini-2.5-flash"
RETRY = RetryConfig(inline_wait_max_s=10.0, transient_initial_s=0.05)


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini.start({"agents": {"*": [{"text": "ok"}]}}) as server:
        yield server


def model_for(
    fake: FakeGemini, governor: Governor | None, waits: list[tuple[float, str]] | None = None
) -> BatonGemini:
    cfg = ModelConfig(name=MODEL, base_url=fake.url, api_key=SecretStr("fake-key"))
    on_wait = None if waits is None else lambda s, why: waits.append((s, why))
    return build_model(cfg, RETRY, governor=governor, on_wait=on_wait)


def governor(client: redis.Redis, quota: QuotaConfig | None = None) -> Governor:
    return Governor(client, {MODEL: quota or QuotaConfig()}, QuotaConfig())


def calls(model: BatonGemini, count: int, *, stream: bool = False) -> list[Any]:
    """Make `count` model calls one after the other, as one stage would; the replies."""

    async def run() -> list[Any]:
        replies = []
        try:
            for _ in range(count):
                request = LlmRequest(
                    model=MODEL,
                    contents=[types.Content(role="user", parts=[types.Part(text="hi")])],
                )
                replies.append([r async for r in model.generate_content_async(request, stream)])
        finally:
            await close_model(model)
        return replies

    return asyncio.run(run())


def statuses(fake: FakeGemini) -> list[int]:
    return [entry["status"] for entry in fake.requests()]


def test_a_429_mid_stage_cools_the_fleet_and_is_waited_out_inside_the_call(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    fake.set_faults([{"requests": [2], "status": 429, "retry_delay_s": 1}])
    waits: list[tuple[float, str]] = []
    model = model_for(fake, governor(redis_client), waits)

    calls(model, 2)

    refused, resent = fake.requests()[1:]
    assert statuses(fake) == [200, 429, 200]
    assert 1.0 <= resent["ts"] - refused["ts"] <= 1.6
    assert [why for _, why in waits] == ["cooldown after 429"]
    assert 1.0 <= model.waited_s <= 1.6


def test_a_429_on_a_stages_first_call_goes_to_celery_and_still_cools_the_fleet(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    fake.set_faults([{"requests": [1], "status": 429, "retry_delay_s": 3}])

    with pytest.raises(errors.ClientError) as caught:
        calls(model_for(fake, governor(redis_client)), 1)
    cooling_ms = redis_client.pttl(keys.cooldown(MODEL))
    calls(model_for(fake, governor(redis_client)), 1)

    mapped = model_error(caught.value)
    assert isinstance(mapped, RateLimitedError) and mapped.delay_s == 3.0
    assert 2_500 < cooling_ms <= 3_000
    refused, other_worker = fake.requests()
    assert statuses(fake) == [429, 200]
    assert other_worker["ts"] - refused["ts"] >= 3.0


def test_a_stage_waits_out_only_a_few_429s_inline_before_going_to_celery(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    fake.set_faults([{"requests": [2, 3, 4, 5, 6], "status": 429, "retry_delay_s": 0.2}])
    model = model_for(fake, governor(redis_client))

    with pytest.raises(errors.ClientError):
        calls(model, 2)

    assert model.max_inline_429s == 3
    assert statuses(fake) == [200, 429, 429, 429, 429]


def test_a_long_429_delay_mid_stage_goes_to_celery(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    fake.set_faults([{"requests": [2], "status": 429, "retry_delay_s": 30}])

    with pytest.raises(errors.ClientError):
        calls(model_for(fake, governor(redis_client)), 2)

    assert statuses(fake) == [200, 429]
    assert redis_client.pttl(keys.cooldown(MODEL)) > 29_000


def test_without_a_governor_a_429_mid_stage_is_still_waited_out(fake: FakeGemini) -> None:
    fake.set_faults([{"requests": [2], "status": 429, "retry_delay_s": 0.5}])
    waits: list[tuple[float, str]] = []
    model = model_for(fake, None, waits)

    calls(model, 2)

    assert statuses(fake) == [200, 429, 200]
    assert [why for _, why in waits] == ["cooldown after 429"]
    assert model.waited_s >= 0.5


def test_a_quota_wait_past_the_inline_limit_never_reaches_the_server(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    model = model_for(fake, governor(redis_client, QuotaConfig(requests_per_minute=1)))

    with pytest.raises(QuotaWaitError) as caught:
        calls(model, 2)

    assert model_error(caught.value) is None
    assert caught.value.delay_s is not None and 59.0 < caught.value.delay_s <= 61.0
    assert statuses(fake) == [200]


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_the_window_holds_each_calls_real_prompt_and_reply_tokens(
    fake: FakeGemini, redis_client: redis.Redis, stream: bool
) -> None:
    model = model_for(fake, governor(redis_client, QuotaConfig(tokens_per_minute=100_000)))

    calls(model, 2, stream=stream)

    members = redis_client.zrange(keys.quota(MODEL), 0, -1, withscores=True)
    recorded = sorted(int(member.split(":")[1]) for member, _ in members)
    # A call's whole bill counts against the quota: prompt, reply and thinking, as the server
    # sums them in totalTokenCount.
    served = sorted(
        e["prompt_tokens"] + e["candidates_tokens"] + e["thoughts_tokens"] for e in fake.requests()
    )
    assert recorded == served


def test_a_quota_wait_under_the_inline_limit_is_slept_and_shown(
    fake: FakeGemini, redis_client: redis.Redis
) -> None:
    quota = QuotaConfig(requests_per_minute=1)
    waits: list[tuple[float, str]] = []
    model = model_for(fake, Governor(redis_client, {MODEL: quota}, QuotaConfig(), window_s=1.0))
    model.on_wait = lambda s, why: waits.append((s, why))

    started = time.monotonic()
    calls(model, 2)
    elapsed_s = time.monotonic() - started

    assert statuses(fake) == [200, 200]
    first, second = fake.requests()
    assert second["ts"] - first["ts"] >= 1.0
    assert [why for _, why in waits] == ["quota: requests per minute"]
    assert 0.9 <= model.waited_s <= elapsed_s

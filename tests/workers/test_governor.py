"""The fleet-wide quota governor against a real redis-server: windows, tokens, cooldowns."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from orchestrator.core import keys
from orchestrator.core.settings import QuotaConfig
from workers.errors import QuotaWaitError, RateLimitedError
from workers.governor import JITTER_S, SETTLE_S, WINDOW_MARGIN_S, Governor, Permit

MODEL = "gemini-2.5-flash"
NO_QUOTA = QuotaConfig()

MakeGovernor = Callable[..., Governor]


@pytest.fixture
def governor_for(redis_client: redis.Redis) -> MakeGovernor:
    """Governors on the unit-test database; each is one worker of the same fleet."""

    def make(
        quota: QuotaConfig = NO_QUOTA, *, window_s: float = 60.0, regain: float = 0.02
    ) -> Governor:
        return Governor(
            redis_client, {MODEL: quota}, NO_QUOTA, window_s=window_s, regain_per_window=regain
        )

    return make


def acquire(governor: Governor, tokens: int = 10, **kwargs: Any) -> Permit:
    kwargs.setdefault("max_sleep_s", 0.0)
    return asyncio.run(governor.acquire(MODEL, tokens, **kwargs))


def test_requests_per_minute_let_n_calls_through_and_the_next_waits_for_the_first_to_leave(
    governor_for: MakeGovernor,
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=3), window_s=2.0)
    waits: list[tuple[float, str]] = []

    first = acquire(governor)
    first_at = time.monotonic()
    passed = [first, acquire(governor), acquire(governor)]
    fourth = acquire(governor, max_sleep_s=5.0, on_wait=lambda s, why: waits.append((s, why)))
    fourth_at = time.monotonic()

    window_s = 2.0 + WINDOW_MARGIN_S
    assert [p.slept_s for p in passed] == [0.0, 0.0, 0.0]
    assert window_s - 0.05 <= fourth_at - first_at <= window_s + JITTER_S[1] + 0.2
    assert fourth.slept_s >= window_s - 0.1
    assert {why for _, why in waits} == {"quota: requests per minute"}


def test_a_wait_past_the_inline_limit_raises_quota_wait_error_with_the_delay(
    governor_for: MakeGovernor,
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=1))
    acquire(governor)

    with pytest.raises(QuotaWaitError) as caught:
        acquire(governor, max_sleep_s=10.0)

    assert isinstance(caught.value, RateLimitedError)
    window_s = 60.0 + WINDOW_MARGIN_S
    assert caught.value.delay_s is not None
    assert window_s - 1.0 <= caught.value.delay_s <= window_s
    assert "requests-per-minute quota of gemini-2.5-flash" in str(caught.value)


def test_quota_wait_error_survives_pickling() -> None:
    error = QuotaWaitError("quota used up for another 12.0s", 12.0)

    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is QuotaWaitError
    assert (str(copy), copy.delay_s) == ("quota used up for another 12.0s", 12.0)


def test_tokens_per_minute_count_the_estimate_until_reconcile_corrects_it(
    governor_for: MakeGovernor, redis_client: redis.Redis
) -> None:
    governor = governor_for(QuotaConfig(tokens_per_minute=1000))
    permit = acquire(governor, tokens=800)

    with pytest.raises(QuotaWaitError) as caught:
        acquire(governor, tokens=300)
    governor.reconcile(permit, 500)
    second = acquire(governor, tokens=300)

    assert "tokens-per-minute quota" in str(caught.value)
    assert second.slept_s == 0.0
    members = redis_client.zrange(keys.quota(MODEL), 0, -1)
    assert sorted(m.split(":")[1] for m in members) == ["300", "500"]


def test_a_call_larger_than_the_whole_token_quota_goes_alone(governor_for: MakeGovernor) -> None:
    governor = governor_for(QuotaConfig(tokens_per_minute=100))

    alone = acquire(governor, tokens=5000)
    with pytest.raises(QuotaWaitError):
        acquire(governor, tokens=1)

    assert alone.slept_s == 0.0


def test_a_cooldown_blocks_every_worker_until_it_passes(governor_for: MakeGovernor) -> None:
    one, other = governor_for(), governor_for(QuotaConfig(requests_per_minute=100))
    waits: list[str] = []

    one.cooldown(MODEL, 1.0)
    started = time.monotonic()
    with pytest.raises(QuotaWaitError) as caught:
        acquire(one, max_sleep_s=0.5)
    permit = acquire(other, max_sleep_s=5.0, on_wait=lambda s, why: waits.append(why))
    elapsed_s = time.monotonic() - started

    assert caught.value.delay_s is not None and 0.9 <= caught.value.delay_s <= 1.0
    assert "cooling down after a 429" in str(caught.value)
    assert 1.0 <= elapsed_s <= 1.0 + JITTER_S[1] + 0.2
    assert permit.slept_s >= 0.95
    assert waits == ["cooldown after 429"]


def test_a_cooldown_is_extended_but_never_shortened(
    governor_for: MakeGovernor, redis_client: redis.Redis
) -> None:
    governor = governor_for()

    governor.cooldown(MODEL, 30.0)
    governor.cooldown(MODEL, 1.0)
    kept_ms = redis_client.pttl(keys.cooldown(MODEL))
    governor.cooldown(MODEL, 45.0)
    extended_ms = redis_client.pttl(keys.cooldown(MODEL))

    assert 29_000 < kept_ms <= 30_000
    assert 44_000 < extended_ms <= 45_000


def test_a_model_without_limits_costs_one_round_trip_and_records_nothing(
    governor_for: MakeGovernor, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    governor = governor_for()
    acquire(governor)  # loads the script
    commands: list[str] = []
    send = redis_client.execute_command

    def counted(*args: Any, **kwargs: Any) -> Any:
        commands.append(str(args[0]))
        return send(*args, **kwargs)

    monkeypatch.setattr(redis_client, "execute_command", counted)
    permit = acquire(governor)

    assert commands == ["EVALSHA"]
    assert permit.member is None
    assert redis_client.exists(keys.quota(MODEL)) == 0


def test_the_window_runs_on_redis_time_not_the_workers_clock(
    governor_for: MakeGovernor, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=10))
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)

    acquire(governor)
    seconds, micros = redis_client.time()
    score_ms = redis_client.zrange(keys.quota(MODEL), 0, 0, withscores=True)[0][1]

    assert abs(score_ms - (seconds * 1000 + micros / 1000)) < 1000
    assert 0 < redis_client.pttl(keys.quota(MODEL)) <= (60 + WINDOW_MARGIN_S) * 1000


def test_reconcile_and_cooldown_log_redis_errors_instead_of_failing_the_stage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    governor = Governor(unreachable, {MODEL: QuotaConfig(tokens_per_minute=10)}, NO_QUOTA)

    with caplog.at_level(logging.WARNING, logger="workers.governor"):
        governor.reconcile(Permit(MODEL, "abc:10", 0.0), 20)
        governor.cooldown(MODEL, 3.0)

    assert "could not correct the token count of a gemini-2.5-flash call" in caplog.text
    assert "could not set the cooldown of gemini-2.5-flash" in caplog.text


def calls_let_through(governor: Governor, most: int = 50) -> int:
    """How many calls in a row the governor lets through without a wait."""
    for n in range(most):
        try:
            acquire(governor)
        except QuotaWaitError:
            return n
    return most


def test_a_429_lowers_the_quota_every_worker_believes_to_nine_tenths_of_what_was_in_use(
    governor_for: MakeGovernor,
) -> None:
    one = governor_for(QuotaConfig(requests_per_minute=10), window_s=1.0, regain=0.001)
    other = governor_for(QuotaConfig(requests_per_minute=10), window_s=1.0, regain=0.001)
    before = calls_let_through(one)

    one.cooldown(MODEL, 0.05)
    time.sleep(1.0 + WINDOW_MARGIN_S + 0.1)  # the ten calls have left the window
    after = calls_let_through(other)

    assert before == 10
    assert after == 9  # 0.9 × the 10 calls in use when the 429 came


def test_the_429s_of_one_episode_lower_the_belief_once(governor_for: MakeGovernor) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=10), window_s=1.0, regain=0.001)
    calls_let_through(governor)

    for _ in range(4):  # calls that were under way when the first 429 came
        governor.cooldown(MODEL, 0.5)
    time.sleep(1.0 + WINDOW_MARGIN_S + 0.1)

    assert calls_let_through(governor) == 9


def test_a_429_in_a_later_episode_lowers_the_belief_from_what_is_in_use_then(
    governor_for: MakeGovernor,
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=20), window_s=1.0, regain=0.001)
    calls_let_through(governor)
    governor.cooldown(MODEL, 0.05)  # 20 in use: 18 believed
    time.sleep(max(SETTLE_S, 1.0 + WINDOW_MARGIN_S) + 0.1)
    for _ in range(10):
        acquire(governor)

    governor.cooldown(MODEL, 0.05)  # 10 of 20 in use when the provider refused: 9 believed
    time.sleep(1.0 + WINDOW_MARGIN_S + 0.1)

    assert calls_let_through(governor) == 9


def test_a_lowered_belief_regains_the_configured_quota_at_the_set_pace_and_then_is_gone(
    governor_for: MakeGovernor, redis_client: redis.Redis
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=10), window_s=1.0, regain=0.05)
    for _ in range(5):
        acquire(governor)

    governor.cooldown(MODEL, 0.05)  # half the quota in use: 0.45 believed
    lowered = governor.believed_share(MODEL)
    expires_ms = redis_client.pttl(keys.quota_scale(MODEL))
    time.sleep(1.0 + WINDOW_MARGIN_S)  # one window
    later = governor.believed_share(MODEL)

    assert lowered == pytest.approx(0.45, abs=0.005)
    assert later == pytest.approx(0.50, abs=0.01)
    window_ms = (1.0 + WINDOW_MARGIN_S) * 1000
    assert expires_ms == pytest.approx((1 - 0.45) / 0.05 * window_ms, abs=50)


def test_the_belief_never_drops_below_a_tenth_of_the_configured_quota(
    governor_for: MakeGovernor,
) -> None:
    governor = governor_for(QuotaConfig(requests_per_minute=100), window_s=1.0, regain=0.001)
    acquire(governor)

    governor.cooldown(MODEL, 0.05)  # 1 of 100 in use

    assert governor.believed_share(MODEL) == pytest.approx(0.1, abs=0.001)


def test_a_429_for_a_model_without_a_quota_only_cools_the_fleet_down(
    governor_for: MakeGovernor, redis_client: redis.Redis
) -> None:
    governor = governor_for()

    governor.cooldown(MODEL, 5.0)

    assert redis_client.exists(keys.quota_scale(MODEL)) == 0
    assert 4_000 < redis_client.pttl(keys.cooldown(MODEL)) <= 5_000
    assert governor.believed_share(MODEL) == 1.0


WORKER = """
import asyncio, json, sys
import redis
from orchestrator.core import keys
from orchestrator.core.settings import QuotaConfig
from workers.governor import Governor

url, model, limit, window_s, calls = sys.argv[1:6]
client = redis.Redis.from_url(url, decode_responses=True)
governor = Governor(
    client, {model: QuotaConfig(requests_per_minute=int(limit))}, QuotaConfig(),
    window_s=float(window_s),
)

async def main():
    for _ in range(int(calls)):
        permit = await governor.acquire(model, 1, max_sleep_s=30)
        print(json.dumps(client.zscore(keys.quota(model), permit.member)), flush=True)

asyncio.run(main())
"""


def test_two_processes_acquiring_at_once_never_exceed_the_limit_in_any_window(
    unit_redis_url: str, redis_client: redis.Redis
) -> None:
    limit, window_s, calls = 5, 1.0, 8
    argv = [sys.executable, "-c", WORKER, unit_redis_url, MODEL, str(limit), str(window_s)]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    workers = [
        subprocess.Popen([*argv, str(calls)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=60)[0] for worker in workers]

    assert [worker.returncode for worker in workers] == [0, 0]
    scores = sorted(json.loads(line) for out in outputs for line in out.splitlines())
    assert len(scores) == 2 * calls
    gaps_ms = [later - earlier for earlier, later in zip(scores, scores[limit:], strict=False)]
    assert min(gaps_ms) >= (window_s + WINDOW_MARGIN_S) * 1000

"""The fleet-wide quota governor: every worker asks Redis before each model call.

Celery's `rate_limit` is per worker and google-genai ignores `retryDelay`, so a fleet sharing
one model quota needs a limiter of its own (shared/notes/celery-flower.md §2–§3). Per model,
two keys (`orchestrator.keys`):

* `keys.quota(model)`: the calls of the last window (a minute), a sorted set scored by Redis
  time in milliseconds, member `<id>:<tokens>`; it expires after a window of no use.
* `keys.cooldown(model)`: exists while the fleet waits out a 429; its TTL is the wait.

One Lua script checks the cooldown, then requests and tokens per window, and either records
the call or says how long to wait. Every clock reading is Redis's (`TIME`, `PTTL`), never a
worker's, so workers on hosts with skewed clocks still share one window. A model without
limits costs one round trip (the cooldown check) and records nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from orchestrator import keys
from orchestrator.settings import QuotaConfig
from workers.errors import QuotaWaitError

logger = logging.getLogger(__name__)

WINDOW_S = 60.0
"""The quotas' sliding window: requests and tokens *per minute*."""
WINDOW_MARGIN_S = 0.5
"""A call stays in the window this much longer than the provider counts it: the provider's
clock starts when the request arrives, tens of milliseconds after the permit (more for a
stage's first call, which opens a connection). Costs under 1% of a one-minute quota."""
JITTER_S = (0.01, 0.2)
"""Bounds of the random time added to every wait, so that waiting workers do not all ask at
the same instant."""

WaitCallback = Callable[[float, str], None]
"""Told the seconds about to be slept and why ("quota: requests per minute", …)."""

REASONS = {
    "cooldown": "cooldown after 429",
    "requests": "quota: requests per minute",
    "tokens": "quota: tokens per minute",
}
"""What the script's answers mean, as a person reads them."""

ACQUIRE_LUA = """
-- KEYS[1]: the model's calls of the last window; KEYS[2]: the model's cooldown after a 429.
-- ARGV: member "<id>:<tokens>", tokens, max requests, max tokens (0: no limit), window (ms).
-- Returns {0, "ok"} once the call is recorded, else {milliseconds to wait, why}.
local cooling = redis.call('PTTL', KEYS[2])
if cooling > 0 then return {cooling, 'cooldown'} end
local max_requests, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
if max_requests == 0 and max_tokens == 0 then return {0, 'ok'} end
local tokens, window = tonumber(ARGV[2]), tonumber(ARGV[5])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.3f', now - window))
local calls = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local count, wait, why = #calls / 2, 0, 'ok'
if max_requests > 0 and count >= max_requests then
  -- the oldest calls leave until one fewer than the limit is left
  wait, why = tonumber(calls[2 * (count - max_requests) + 2]) + window - now, 'requests'
end
if max_tokens > 0 then
  local function cost(i) return tonumber(string.match(calls[i], ':(%d+)$')) end
  local excess = tokens - max_tokens
  for i = 1, #calls, 2 do excess = excess + cost(i) end
  local i = 1
  while excess > 0 and i < #calls do excess, i = excess - cost(i), i + 2 end
  -- calls[i - 1] is the time of the last call that must leave; with none, a call larger
  -- than the whole quota goes alone
  if i > 1 and tonumber(calls[i - 1]) + window - now > wait then
    wait, why = tonumber(calls[i - 1]) + window - now, 'tokens'
  end
end
if wait > 0 then return {math.ceil(wait), why} end
redis.call('ZADD', KEYS[1], string.format('%.3f', now), ARGV[1])
redis.call('PEXPIRE', KEYS[1], window)
return {0, 'ok'}
"""

RECONCILE_LUA = """
-- KEYS[1]: the model's calls; ARGV[1]: a call's estimate; ARGV[2]: the same call, real tokens.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], score, ARGV[2])
return 1
"""


@dataclass(frozen=True)
class Permit:
    """A model call the governor let through."""

    model: str
    member: str | None
    """The call's entry in the quota window; None when nothing was recorded (no limits)."""
    slept_s: float
    """Time slept waiting for room or for a cooldown to end."""


class Governor:
    """Fleet-wide requests and tokens per minute, and a shared cooldown after a 429.

    With no quotas at all it still enforces cooldowns. `window_s` shortens the minute (tests);
    calls stay in it `WINDOW_MARGIN_S` longer.
    """

    def __init__(
        self,
        client: redis.Redis,
        quotas: Mapping[str, QuotaConfig],
        default: QuotaConfig,
        *,
        window_s: float = WINDOW_S,
    ) -> None:
        self._client = client
        self._quotas = dict(quotas)
        self._default = default
        self._window_ms = round((window_s + WINDOW_MARGIN_S) * 1000)
        self._acquire_script = client.register_script(ACQUIRE_LUA)
        self._reconcile_script = client.register_script(RECONCILE_LUA)

    def quota(self, model: str) -> QuotaConfig:
        """The quota of `model`: its own, else the default."""
        return self._quotas.get(model, self._default)

    async def acquire(
        self,
        model: str,
        estimated_tokens: int,
        *,
        max_sleep_s: float,
        on_wait: WaitCallback | None = None,
    ) -> Permit:
        """Wait until the model's cooldown is over and its quota has room, then record the call.

        Waits are slept here (plus jitter, after `on_wait` hears of them) while they add up to
        at most `max_sleep_s`.

        Raises:
            QuotaWaitError: the next wait would go past `max_sleep_s`; its `delay_s` is the wait.
        """
        tokens = max(0, int(estimated_tokens))
        member = f"{uuid.uuid4().hex}:{tokens}"
        slept_s = 0.0
        while True:
            wait_ms, why = self._ask(model, member, tokens)
            if wait_ms == 0:
                limited = self._limits(model) != (0, 0)
                return Permit(model, member if limited else None, round(slept_s, 3))
            wait_s = wait_ms / 1000
            if slept_s + wait_s > max_sleep_s:
                raise QuotaWaitError(_wait_message(model, why, wait_s), wait_s)
            wait_s += random.uniform(*JITTER_S)
            if on_wait is not None:
                on_wait(wait_s, REASONS[why])
            logger.info("%s: waiting %.2fs (%s)", model, wait_s, REASONS[why])
            await asyncio.sleep(wait_s)
            slept_s += wait_s

    def reconcile(self, permit: Permit, actual_tokens: int) -> None:
        """Replace the call's estimate with its real prompt plus reply tokens. Never raises."""
        if permit.member is None or self.quota(permit.model).tokens_per_minute is None:
            return
        call_id = permit.member.rsplit(":", 1)[0]
        try:
            self._reconcile_script(
                keys=[keys.quota(permit.model)],
                args=[permit.member, f"{call_id}:{max(0, int(actual_tokens))}"],
            )
        except redis.RedisError as exc:
            logger.warning("could not correct the token count of a %s call: %s", permit.model, exc)

    def cooldown(self, model: str, delay_s: float) -> None:
        """No worker calls `model` for `delay_s`: extends the fleet's cooldown, never shortens
        it. Never raises (a Redis error is logged)."""
        delay_ms = max(1, math.ceil(delay_s * 1000))
        key = keys.cooldown(model)
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.set(key, "429", px=delay_ms, nx=True)
                pipe.pexpire(key, delay_ms, gt=True)
                pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not set the cooldown of %s: %s", model, exc)
            return
        logger.info("%s: the fleet cools down for at least %.1fs after a 429", model, delay_s)

    def _ask(self, model: str, member: str, tokens: int) -> tuple[int, str]:
        max_requests, max_tokens = self._limits(model)
        wait_ms, why = self._acquire_script(
            keys=[keys.quota(model), keys.cooldown(model)],
            args=[member, tokens, max_requests, max_tokens, self._window_ms],
        )
        return int(wait_ms), why.decode() if isinstance(why, bytes) else str(why)

    def _limits(self, model: str) -> tuple[int, int]:
        """Requests and tokens per window; 0 for no limit."""
        quota = self.quota(model)
        return quota.requests_per_minute or 0, quota.tokens_per_minute or 0


def _wait_message(model: str, why: str, wait_s: float) -> str:
    if why == "cooldown":
        return f"{model} is cooling down after a 429 for another {wait_s:.1f}s"
    kind = "requests" if why == "requests" else "tokens"
    return (
        f"the fleet's {kind}-per-minute quota of {model} is used up for another {wait_s:.1f}s "
        "(BATON_QUOTAS sets it)"
    )

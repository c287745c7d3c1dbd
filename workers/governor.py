"""The fleet-wide quota governor: every worker asks Redis before each model call.

Celery's `rate_limit` is per worker and google-genai ignores `retryDelay`, so a fleet sharing
one model quota needs a limiter of its own (shared/notes/celery-flower.md §2–§3). Per model,
three keys (`orchestrator.core.keys`):

* `keys.quota(model)`: the calls of the last window (a minute), a sorted set scored by Redis
  time in milliseconds, member `<id>:<tokens>`; it expires after a window of no use.
* `keys.cooldown(model)`: exists while the fleet waits out a 429; its TTL is the wait.
* `keys.quota_scale(model)`: the share of its configured quota the fleet believes the model
  allows, once a 429 has shown the configured quota to be too high.

One Lua script checks the cooldown, then requests and tokens per window, and either records
the call or says how long to wait. Every clock reading is Redis's (`TIME`, `PTTL`), never a
worker's, so workers on hosts with skewed clocks still share one window. A model without
limits costs one round trip (the cooldown check) and records nothing.

A 429 means the provider allows less than the fleet believed: a quota set too high, another
client on the same key, a provider counting in clock minutes rather than a sliding one. So
besides the cooldown, the first 429 of an episode lowers the quota the fleet believes, for
every worker: to `BACKOFF` times the share of the quota that was in use when it came (or of
the share believed until then, if that is less). From there the belief regains
`REGAIN_PER_WINDOW` of the configured quota per minute without a 429. The 429s of calls
already under way when the first one arrived belong to its episode and lower nothing more.
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

from orchestrator.core import keys
from orchestrator.core.settings import QuotaConfig
from workers.errors import QuotaWaitError

logger = logging.getLogger(__name__)

WINDOW_S = 60.0
"""The quotas' sliding window: requests and tokens *per minute*."""
WINDOW_MARGIN_S = 0.5
"""A call stays in the window this much longer than the provider counts it: the provider's
clock starts when the request arrives, tens of milliseconds after the permit (more for a
stage's first call, which opens a connection). Costs under 1% of a one-minute quota."""
BACKOFF = 0.9
"""After a 429, the fleet believes the model allows this share of what it was using."""
REGAIN_PER_WINDOW = 0.02
"""Share of the configured quota a lowered belief regains per window without a 429: from 90%
back to 100% in five minutes. A provider that really allows less is probed again now and then,
one 429 at a time."""
MIN_SHARE = 0.1
"""The belief never drops below this share of the configured quota."""
SETTLE_S = 2.0
"""A 429 this soon after the belief was lowered belongs to the same episode."""
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

SHARE_LUA = """
-- The share of its configured quota the fleet believes a model allows at `now` (Redis ms).
local function believed_share(key, now, window, regain)
  local low = redis.call('HMGET', key, 'low', 'at_ms')
  if not low[1] then return 1 end
  return math.min(1, tonumber(low[1]) + regain * (now - tonumber(low[2])) / window)
end
local function redis_now()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
end
"""

ACQUIRE_LUA = (
    SHARE_LUA
    + """
-- KEYS[1]: the model's calls of the last window; KEYS[2]: the model's cooldown after a 429;
-- KEYS[3]: the share of its quota the fleet believes the model allows.
-- ARGV: member "<id>:<tokens>", tokens, max requests, max tokens (0: no limit), window (ms),
-- share regained per window.
-- Returns {0, "ok"} once the call is recorded, else {milliseconds to wait, why}.
local cooling = redis.call('PTTL', KEYS[2])
if cooling > 0 then return {cooling, 'cooldown'} end
local max_requests, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
if max_requests == 0 and max_tokens == 0 then return {0, 'ok'} end
local tokens, window = tonumber(ARGV[2]), tonumber(ARGV[5])
local now = redis_now()
local share = believed_share(KEYS[3], now, window, tonumber(ARGV[6]))
if max_requests > 0 then max_requests = math.max(1, math.floor(max_requests * share)) end
if max_tokens > 0 then max_tokens = math.max(1, math.floor(max_tokens * share)) end
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
)

LEARN_LUA = (
    SHARE_LUA
    + """
-- A 429 arrived. KEYS as for the acquire script.
-- ARGV: cooldown (ms), max requests, max tokens (0: no limit), window (ms), share regained per
-- window, backoff, lowest share, settle time (ms).
-- Starts or extends the cooldown, never shortens it. On the first 429 of an episode (no
-- cooldown running, the belief not lowered within the settle time) lowers the believed share
-- to backoff × the share in use, or × the share believed if that is less or nothing is in use.
-- Returns {1 if it lowered the belief else 0, the believed share as a string}.
local delay = tonumber(ARGV[1])
local fresh = redis.call('PTTL', KEYS[2]) <= 0
redis.call('SET', KEYS[2], '429', 'PX', delay, 'NX')
redis.call('PEXPIRE', KEYS[2], delay, 'GT')
local max_requests, max_tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
if max_requests == 0 and max_tokens == 0 then return {0, '1'} end
local window, regain = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = redis_now()
local share = believed_share(KEYS[3], now, window, regain)
local lowered_at = tonumber(redis.call('HGET', KEYS[3], 'at_ms') or '-1e18')
if not fresh or now - lowered_at < tonumber(ARGV[8]) then return {0, tostring(share)} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.3f', now - window))
local calls = redis.call('ZRANGE', KEYS[1], 0, -1)
local used = 0
if max_requests > 0 then used = #calls / max_requests end
if max_tokens > 0 then
  local spent = 0
  for _, member in ipairs(calls) do spent = spent + tonumber(string.match(member, ':(%d+)$')) end
  used = math.max(used, spent / max_tokens)
end
local basis = share
if used > 0 and used < share then basis = used end
local low = math.max(tonumber(ARGV[7]), basis * tonumber(ARGV[6]))
redis.call('HSET', KEYS[3], 'low', tostring(low), 'at_ms', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[3], math.ceil((1 - low) / regain * window))
return {1, tostring(low)}
"""
)

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
    """Fleet-wide requests and tokens per minute, lowered after a 429 and regained slowly, and
    a shared cooldown after a 429.

    With no quotas at all it still enforces cooldowns (and has no quota to lower). `window_s`
    shortens the minute (tests); calls stay in it `WINDOW_MARGIN_S` longer. A lowered belief
    regains `regain_per_window` of the configured quota per window.
    """

    def __init__(
        self,
        client: redis.Redis,
        quotas: Mapping[str, QuotaConfig],
        default: QuotaConfig,
        *,
        window_s: float = WINDOW_S,
        regain_per_window: float = REGAIN_PER_WINDOW,
    ) -> None:
        if regain_per_window <= 0:
            raise ValueError(f"regain_per_window must be positive, not {regain_per_window}")
        self._client = client
        self._quotas = dict(quotas)
        self._default = default
        self._window_ms = round((window_s + WINDOW_MARGIN_S) * 1000)
        self._regain = regain_per_window
        self._acquire_script = client.register_script(ACQUIRE_LUA)
        self._learn_script = client.register_script(LEARN_LUA)
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
        """A 429: no worker calls `model` for `delay_s` (the fleet's cooldown is extended, never
        shortened), and the first 429 of an episode lowers the quota the fleet believes `model`
        allows (module docstring). Never raises (a Redis error is logged)."""
        delay_ms = max(1, math.ceil(delay_s * 1000))
        max_requests, max_tokens = self._limits(model)
        args = [delay_ms, max_requests, max_tokens, self._window_ms, self._regain, BACKOFF,
                MIN_SHARE, round(SETTLE_S * 1000)]  # fmt: skip
        try:
            lowered, share = self._learn_script(keys=self._keys(model), args=args)
        except redis.RedisError as exc:
            logger.warning("could not set the cooldown of %s: %s", model, exc)
            return
        logger.info("%s: the fleet cools down for at least %.1fs after a 429", model, delay_s)
        if int(lowered):
            logger.warning(
                "%s answered 429: the fleet now takes its quota to be %.0f%% of the configured "
                "one, regaining %.0f%% of it per minute without a 429",
                model, 100 * float(share), 100 * self._regain,
            )  # fmt: skip

    def believed_share(self, model: str) -> float:
        """The share of its configured quota the fleet now believes `model` allows: 1.0 unless
        a 429 lowered it and it has not regained it all."""
        seconds, micros = self._client.time()
        now_ms = seconds * 1000 + micros / 1000
        low, at_ms = self._client.hmget(keys.quota_scale(model), ["low", "at_ms"])
        if low is None or at_ms is None:
            return 1.0
        return min(1.0, float(low) + self._regain * (now_ms - float(at_ms)) / self._window_ms)

    def _keys(self, model: str) -> list[str]:
        return [keys.quota(model), keys.cooldown(model), keys.quota_scale(model)]

    def _ask(self, model: str, member: str, tokens: int) -> tuple[int, str]:
        max_requests, max_tokens = self._limits(model)
        wait_ms, why = self._acquire_script(
            keys=self._keys(model),
            args=[member, tokens, max_requests, max_tokens, self._window_ms, self._regain],
        )
        return int(wait_ms), why.decode() if isinstance(why, bytes) else str(why)

    def _limits(self, model: str) -> tuple[int, int]:
        """Requests and tokens per window as configured; 0 for no limit."""
        quota = self.quota(model)
        return quota.requests_per_minute or 0, quota.tokens_per_minute or 0


def _wait_message(model: str, why: str, wait_s: float) -> str:
    if why == "cooldown":
        return f"{model} is cooling down after a 429 for another {wait_s:.1f}s"
    kind = "requests" if why == "requests" else "tokens"
    return (
        f"the fleet's {kind}-per-minute quota of {model} is used up for another {wait_s:.1f}s "
        "(BATON_QUOTAS sets it; a 429 lowers it for a while)"
    )

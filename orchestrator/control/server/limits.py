"""How many failed logins `baton serve` lets through: counted in Redis, so that every replica
shares the count, in a sliding window of `ServeSettings.login_window_s`.

A login attempt is counted on the counters that apply to it:

- from a browser that has logged in as that user before (`Sessions.browser`): that browser's
  own counter, `login_failures_per_user`;
- from anywhere else: its client address's (`login_failures_per_address`, every user name
  together; an IPv6 address by its /64, which one client usually holds whole) and the user
  name's (`login_failures_per_user`, every address together; names that exist and names that
  do not alike, so that a 429 does not tell which exist).

An attempt takes a place in each of its counters before the password is checked, in one
transaction, so that replicas racing each other cannot let more through. If a counter is full
the attempt is refused (429, `Retry-After`: when its oldest failure leaves the window) without
its password being checked, and gives its places back: refused attempts are not counted, so
hammering does not lengthen a lockout, which ends one window after the last failure counted at
the latest. A successful login gives its places back too, but clears nothing: a real user
logging in must not hand an attacker a fresh allowance.

Locking a user out: an attacker failing as `ana` from many addresses fills `ana`'s counter, and
for as long as the attack goes on no new browser logs in as her. The browsers she has logged in
from (within `sessions.TRUSTED_BROWSER_S`) are counted apart and still let her in, and an
attacker has no way to fill their counters without their cookies (OWASP's "device cookies").
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from orchestrator.control.server.auth import ServeSettings
from orchestrator.core import keys

IPV6_PREFIX = 64
"""An IPv6 client is counted by its network of this size: one host commonly holds a /64."""


@dataclass(frozen=True)
class Counter:
    """One sliding window of failures, full at `limit`."""

    key: str
    limit: int


@dataclass(frozen=True)
class Attempt:
    """A login attempt's places in its counters; `retry_after_s` set when it was refused."""

    member: str
    counters: tuple[Counter, ...]
    retry_after_s: int | None = None

    @property
    def refused(self) -> bool:
        return self.retry_after_s is not None


class LoginLimiter:
    """Counts failed logins per client address, user name and browser in Redis."""

    def __init__(
        self, client: redis.Redis, settings: ServeSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.redis = client
        self.window_s = settings.login_window_s
        self.per_address = settings.login_failures_per_address
        self.per_user = settings.login_failures_per_user
        self.clock = clock

    def counters(self, address: str, user: str, browser: str | None) -> tuple[Counter, ...]:
        """The counters of an attempt to log in as `user` from `address`, from a browser that
        logged in as `user` before if `browser` (that browser cookie's digest) is given."""
        if browser is not None:
            return (Counter(keys.serve_failures("browser", browser), self.per_user),)
        return (
            Counter(keys.serve_failures("address", _digest(client_key(address))), self.per_address),
            Counter(keys.serve_failures("user", _digest(user)), self.per_user),
        )

    def begin(self, counters: Sequence[Counter]) -> Attempt:
        """Takes a place in every counter: a refused attempt if one of them was full (its
        places given back), else one counted as failed unless `succeeded` is called."""
        now = self.clock()
        member = f"{now:.6f}:{secrets.token_hex(8)}"
        ttl_ms = math.ceil(self.window_s * 1000)
        with self.redis.pipeline(transaction=True) as pipe:
            for counter in counters:
                pipe.zremrangebyscore(counter.key, "-inf", now - self.window_s)
                pipe.zadd(counter.key, {member: now})
                pipe.zrange(counter.key, 0, -1, withscores=True)
                pipe.pexpire(counter.key, ttl_ms)
            replies = pipe.execute()
        waits = []
        for counter, entries in zip(counters, replies[2::4], strict=True):
            others = sorted(score for name, score in entries if name != member)
            if len(others) >= counter.limit:  # a place frees when enough of them leave
                waits.append(others[len(others) - counter.limit] + self.window_s - now)
        attempt = Attempt(member, tuple(counters))
        if not waits:
            return attempt
        self.succeeded(attempt)
        return Attempt(member, attempt.counters, max(1, math.ceil(max(waits))))

    def succeeded(self, attempt: Attempt) -> None:
        """The attempt was no failure: its places go back."""
        with self.redis.pipeline(transaction=True) as pipe:
            for counter in attempt.counters:
                pipe.zrem(counter.key, attempt.member)
            pipe.execute()


def client_key(address: str) -> str:
    """What a client address is counted by: an IPv4 address (also one mapped into IPv6), an
    IPv6 address's /64, or the text as given when it is no IP address (a test client)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # no zone index
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/{IPV6_PREFIX}", strict=False))
    return str(ip)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

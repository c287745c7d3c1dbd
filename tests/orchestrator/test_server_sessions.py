"""`baton serve`'s sessions and failed-login counters against a real redis-server, with a clock
the test moves: a session ends for every copy of its cookie at logout, at its expiry and when
its login changes; Redis holds no cookie; failed logins fill their counters, refused attempts
do not lengthen a lockout, a browser that logged in before is counted apart, and replicas racing
each other let no more through than the limit."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis
from pydantic import SecretStr

from orchestrator.control.server.auth import Authenticator, Principal, ServeSettings
from orchestrator.control.server.limits import Counter, LoginLimiter
from orchestrator.control.server.sessions import TRUSTED_BROWSER_S, Sessions

WINDOW_S = 900.0
SECRET = SecretStr("s" * 64)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def settings(**update: object) -> ServeSettings:
    base: dict[str, object] = {
        "user": "ana", "password": SecretStr("pw-ana"), "logins": {"bo": SecretStr("read:pw-bo")},
        "secret": SECRET, "login_window_s": WINDOW_S, "login_failures_per_address": 5,
        "login_failures_per_user": 3,
    }  # fmt: skip
    return ServeSettings(**{**base, **update})


def sessions_of(client: redis.Redis, config: ServeSettings, clock: Clock) -> Sessions:
    return Sessions(client, Authenticator(config), config.session_hours * 3600, clock)


def test_a_session_stands_until_logout_for_every_copy_of_its_cookie(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    sessions = sessions_of(redis_client, settings(), clock)
    ana, bo = (
        sessions.begin(Principal("ana", "control", "session")),
        sessions.begin(Principal("bo", "read", "session")),
    )
    copy = str(ana)
    assert sessions.principal(copy) == Principal("ana", "control", "session")
    sessions.end(ana)
    assert sessions.principal(copy) is None
    assert sessions.principal(bo) == Principal("bo", "read", "session")  # only that one ended


def test_a_session_ends_at_its_expiry_in_the_record_and_in_redis(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    sessions = sessions_of(redis_client, settings(session_hours=2), clock)
    cookie = sessions.begin(Principal("bo", "read", "session"))
    (key,) = redis_client.keys("baton:serve:session:*")
    assert 7190_000 < redis_client.pttl(key) <= 7200_000
    clock.now += 7199
    assert sessions.principal(cookie) is not None
    clock.now += 1
    assert sessions.principal(cookie) is None  # even while Redis still holds it


def test_a_changed_password_scope_login_or_secret_ends_the_logins_sessions(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    cookie = sessions_of(redis_client, settings(), clock).begin(Principal("bo", "read", "session"))
    replica = sessions_of(redis_client, settings(), clock)
    assert replica.principal(cookie) == Principal("bo", "read", "session")
    for change in [
        {"logins": {"bo": SecretStr("read:pw-bo-new")}},
        {"logins": {"bo": SecretStr("control:pw-bo")}},
        {"logins": {}},
        {"secret": SecretStr("t" * 64)},
    ]:
        assert sessions_of(redis_client, settings(**change), clock).principal(cookie) is None
    # A login whose credential did not change keeps its sessions across the others' changes.
    others = settings(user="al", password=SecretStr("pw-al"))
    assert sessions_of(redis_client, others, clock).principal(cookie) is not None


@pytest.mark.parametrize(
    "mangle",
    [
        lambda c: c[:-1] + ("A" if c[-1] != "A" else "B"),  # one character changed
        lambda c: c[:-1],
        lambda c: c + "A",
        lambda c: c[:-1] + "\u00e9",
        lambda c: c[:-1] + "\udc80",
        lambda c: "\x00" * len(c),
        lambda c: c.encode().decode("utf-16-le", "replace"),
        lambda c: "",
    ],
)
def test_a_tampered_or_foreign_cookie_is_no_session(
    redis_client: redis.Redis, mangle: Callable[[str], str]
) -> None:
    sessions = sessions_of(redis_client, settings(), Clock())
    cookie = sessions.begin(Principal("ana", "control", "session"))
    assert sessions.principal(mangle(cookie)) is None
    sessions.end(mangle(cookie))  # ends nothing, raises nothing
    assert sessions.principal(cookie) is not None


def test_redis_holds_digests_of_cookies_never_the_cookies(redis_client: redis.Redis) -> None:
    sessions = sessions_of(redis_client, settings(), Clock())
    cookie = sessions.begin(Principal("ana", "control", "session"))
    browser = sessions.trust_browser("ana", None)
    stored = [(key, redis_client.get(key)) for key in redis_client.keys("*")]
    assert len(stored) == 2
    for key, value in stored:
        for secret in (cookie, browser, "pw-ana"):
            assert secret not in key and secret not in str(value)


def test_a_browser_is_trusted_for_the_user_it_logged_in_as_only(
    redis_client: redis.Redis,
) -> None:
    sessions = sessions_of(redis_client, settings(), Clock())
    browser = sessions.trust_browser("ana", None)
    assert sessions.browser(browser, "ana") is not None
    assert sessions.browser(browser, "bo") is None
    assert sessions.browser(browser[:-1] + "\u00e9", "ana") is None
    (key,) = redis_client.keys("baton:serve:browser:*")
    assert TRUSTED_BROWSER_S - 5 < redis_client.ttl(key) <= TRUSTED_BROWSER_S
    again = sessions.trust_browser("bo", browser)  # another login from the same browser
    assert sessions.browser(browser, "ana") is None
    assert sessions.browser(again, "bo") is not None


def limiter(client: redis.Redis, clock: Clock, **update: object) -> LoginLimiter:
    return LoginLimiter(client, settings(**update), clock)


def fail(limits: LoginLimiter, address: str, user: str, browser: str | None = None) -> bool:
    """One attempt that fails its password, if it was let through; False when refused."""
    return not limits.begin(limits.counters(address, user, browser)).refused


def test_failures_from_one_address_fill_its_counter_and_the_oldest_leaving_frees_a_place(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    limits = limiter(redis_client, clock)
    for i in range(5):  # five user names: only the address's counter (5) fills
        assert fail(limits, "203.0.113.7", f"user-{i}")
        clock.now += 10
    refused = limits.begin(limits.counters("203.0.113.7", "user-9", None))
    assert refused.retry_after_s == WINDOW_S - 50  # when the first failure leaves the window
    assert fail(limits, "203.0.113.8", "user-9")  # another address is its own
    clock.now += WINDOW_S - 50
    assert fail(limits, "203.0.113.7", "user-9")
    assert not fail(limits, "203.0.113.7", "user-10")


def test_refused_attempts_are_not_counted_so_hammering_does_not_lengthen_a_lockout(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    limits = limiter(redis_client, clock)
    for _ in range(3):
        assert fail(limits, "198.51.100.1", "ana")
    for _ in range(200):
        clock.now += 4
        assert not fail(limits, "198.51.100.2", "ana")
    clock.now = 1_800_000_000.0 + WINDOW_S
    assert fail(limits, "198.51.100.3", "ana")  # one window after the last counted failure


def test_a_user_name_is_counted_from_every_address_whether_it_exists_or_not(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    limits = limiter(redis_client, clock)
    for name in ("ana", "nobody"):
        for i in range(3):
            assert fail(limits, f"192.0.2.{i}", name)
        attempt = limits.begin(limits.counters("192.0.2.200", name, None))
        assert attempt.refused and attempt.retry_after_s == WINDOW_S


def test_a_browser_that_logged_in_before_is_counted_apart_from_an_attack_on_its_user(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    sessions, limits = sessions_of(redis_client, settings(), clock), limiter(redis_client, clock)
    browser = sessions.trust_browser("ana", None)
    for i in range(3):
        assert fail(limits, f"192.0.2.{i}", "ana")
    assert not fail(limits, "192.0.2.50", "ana")  # a new browser: refused
    known = sessions.browser(browser, "ana")
    attempt = limits.begin(limits.counters("192.0.2.50", "ana", known))
    assert not attempt.refused
    limits.succeeded(attempt)
    for _ in range(3):  # its own typos fill its own counter only
        assert fail(limits, "192.0.2.50", "ana", known)
    assert not fail(limits, "192.0.2.50", "ana", known)


def test_a_success_gives_its_places_back_but_clears_no_failure(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    limits = limiter(redis_client, clock)
    for _ in range(2):
        assert fail(limits, "192.0.2.1", "ana")
    for _ in range(5):
        ok = limits.begin(limits.counters("192.0.2.1", "ana", None))
        assert not ok.refused
        limits.succeeded(ok)
    assert fail(limits, "192.0.2.1", "ana")
    assert not fail(limits, "192.0.2.1", "ana")


def test_replicas_racing_let_through_no_more_than_the_limit(
    redis_client: redis.Redis, unit_redis_url: str
) -> None:
    clients = [redis.Redis.from_url(unit_redis_url, decode_responses=True) for _ in range(4)]
    counters = (Counter("baton:serve:failures:user:race", 7),)
    let_through: list[bool] = []
    start = threading.Barrier(40)

    def attempt(client: redis.Redis) -> None:
        limits = LoginLimiter(client, settings())
        start.wait()
        let_through.append(not limits.begin(counters).refused)

    threads = [threading.Thread(target=attempt, args=(clients[i % 4],)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert let_through.count(True) == 7
    assert redis_client.zcard("baton:serve:failures:user:race") == 7
    for client in clients:
        client.close()

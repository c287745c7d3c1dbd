"""`baton serve` hardened, for real: each test starts the server in a subprocess on a private
redis-server and talks HTTP to it — login rate limits (per address, per user, a browser that
logged in before, X-Forwarded-For believed only from a configured proxy), sessions that end at
logout and when a login's password or scope changes, the redirect after a login held to this
site as Chromium would read it, cookies and headers it cannot read refused with a 401 (never a
500), `Secure` cookies over HTTPS, and the security headers."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from testkit import services

OPERATOR, VIEWER = "operator", "viewer"
EVIL = "evil.example"

Serving = Callable[..., AbstractContextManager[str]]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this module's own: its failure counters touch no other test's."""
    with services.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def passwords() -> dict[str, str]:
    return {OPERATOR: secrets.token_urlsafe(16), VIEWER: secrets.token_urlsafe(16)}


@pytest.fixture
def serving(redis_url: str, passwords: dict[str, str], tmp_path: Path) -> Serving:
    """Starts `baton serve` with the two logins (operator: control, viewer: read), one cookie
    key, and `overrides` of its `BATON_SERVE_*` settings (`login_window_s=4`); yields its URL."""
    secret = secrets.token_hex(32)
    started = iter(range(1000))

    @contextmanager
    def serve(**overrides: object) -> Iterator[str]:
        env = {
            "BATON_SERVE_USER": OPERATOR,
            "BATON_SERVE_PASSWORD": passwords[OPERATOR],
            "BATON_SERVE_LOGINS": json.dumps({VIEWER: f"read:{passwords[VIEWER]}"}),
            "BATON_SERVE_SECRET": secret,
            **{f"BATON_SERVE_{name.upper()}": str(value) for name, value in overrides.items()},
        }
        logfile = tmp_path / f"serve-{next(started)}.log"
        with services.serve(redis_url, env, logfile=logfile) as url:
            yield url

    return serve


def http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, follow_redirects=False, timeout=10.0)


def log_in(client: httpx.Client, user: str, password: str, **headers: str) -> httpx.Response:
    form = {"user": user, "password": password, "next": "/"}
    return client.post("/login", data=form, headers=headers)


def session_of(reply: httpx.Response) -> str:
    assert reply.status_code == 303 and reply.headers["location"] == "/", reply.text
    return str(reply.cookies["baton_session"])


def me(url: str, cookie: str) -> httpx.Response:
    """/api/v1/me with nothing but `cookie` as the session (a copy of it, sent by anyone)."""
    with http(url) as fresh:
        return fresh.get("/api/v1/me", headers={"Cookie": f"baton_session={cookie}"})


# -- rate limits -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_failed_logins_from_one_address_get_a_429_that_says_how_long_to_wait(
    serving: Serving, passwords: dict[str, str], browser: webdriver.Chrome
) -> None:
    with serving(login_failures_per_address=3, login_window_s=8) as url, http(url) as client:
        for i in range(3):  # three user names: only the address's counter fills
            wrong = log_in(client, f"user-{i}", "guess")
            assert wrong.headers["location"] == "/login?failed=1&next=/"
        started = time.monotonic()
        refused = log_in(client, OPERATOR, passwords[OPERATOR])  # right, and still refused
        assert refused.status_code == 429
        assert "baton_session" not in refused.cookies
        wait_s = int(refused.headers["retry-after"])
        assert 1 <= wait_s <= 8
        assert f"Too many failed logins. Wait {wait_s} seconds" in refused.text

        # What a person sees: the form, saying to wait (the browser is the same address).
        browser.get(f"{url}/login?next=/runs/x")
        browser.find_element(By.ID, "user").send_keys(OPERATOR)
        browser.find_element(By.ID, "password").send_keys(passwords[OPERATOR])
        browser.find_element(By.ID, "log-in").click()
        said = WebDriverWait(browser, 10).until(
            expected_conditions.visibility_of_element_located((By.ID, "login-wait"))
        )
        assert re.fullmatch(r"Too many failed logins\. Wait \d seconds before you try again\.",
                            said.text), said.text  # fmt: skip
        assert browser.find_element(By.ID, "next").get_attribute("value") == "/runs/x"
        assert not browser.find_element(By.ID, "login-failed").is_displayed()

        time.sleep(max(0.0, wait_s - (time.monotonic() - started)) + 0.2)
        session_of(log_in(client, OPERATOR, passwords[OPERATOR]))


@pytest.mark.timeout(120)
def test_forwarded_for_is_believed_from_a_configured_proxy_only(
    serving: Serving, passwords: dict[str, str]
) -> None:
    # Nobody configured: each spoofed address is still the socket's 127.0.0.1.
    with serving(login_failures_per_address=2) as url, http(url) as client:
        for i in range(2):
            log_in(client, f"u{i}", "guess", **{"X-Forwarded-For": f"10.0.0.{i}"})
        spoofed = log_in(client, "u9", "guess", **{"X-Forwarded-For": "10.0.0.99"})
        assert spoofed.status_code == 429
    # The proxy on 127.0.0.1 believed: each client its own counter, by the address the proxy
    # appended, never by what the client wrote before it.
    with (
        serving(login_failures_per_address=2, forwarded_allow_ips="127.0.0.1") as url,
        http(url) as client,
    ):
        for i in range(5):
            reply = log_in(client, f"u{i}", "guess", **{"X-Forwarded-For": f"10.0.1.{i}"})
            assert reply.status_code == 303
        for i in range(2):
            forged = f"10.0.2.{i}, 10.0.0.7"
            assert (
                log_in(client, f"v{i}", "guess", **{"X-Forwarded-For": forged}).status_code == 303
            )
        forged = "192.0.2.1, 10.0.0.7"
        assert log_in(client, "v9", "guess", **{"X-Forwarded-For": forged}).status_code == 429


@pytest.mark.timeout(120)
def test_an_attacked_user_still_logs_in_from_a_browser_used_before_and_no_new_one_does(
    serving: Serving, passwords: dict[str, str]
) -> None:
    settings = {"login_failures_per_user": 3, "forwarded_allow_ips": "127.0.0.1"}
    with serving(**settings) as url, http(url) as own:
        session_of(log_in(own, OPERATOR, passwords[OPERATOR]))  # her usual browser
        assert "baton_browser" in own.cookies
        own.post("/logout")
        with http(url) as attacker:
            for i in range(3):  # from three addresses: the user's counter fills
                reply = log_in(attacker, OPERATOR, "guess", **{"X-Forwarded-For": f"10.3.0.{i}"})
                assert reply.status_code == 303
            again = log_in(attacker, OPERATOR, "guess", **{"X-Forwarded-For": "10.3.0.9"})
            assert again.status_code == 429
        with http(url) as new_browser:
            right = log_in(new_browser, OPERATOR, passwords[OPERATOR])
            assert right.status_code == 429
        cookie = session_of(log_in(own, OPERATOR, passwords[OPERATOR]))
        assert me(url, cookie).json()["name"] == OPERATOR


# -- sessions that end -------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_cookie_copied_before_logout_or_another_login_is_refused_after_it(
    serving: Serving, passwords: dict[str, str]
) -> None:
    with serving() as url, http(url) as client:
        before = session_of(log_in(client, OPERATOR, passwords[OPERATOR]))
        copy = session_of(log_in(client, VIEWER, passwords[VIEWER]))  # the same browser
        assert me(url, before).status_code == 401
        with http(url) as another_browser:
            other = session_of(log_in(another_browser, VIEWER, passwords[VIEWER]))
        assert me(url, copy).json() == {"name": VIEWER, "scope": "read", "flower_url": None}
        assert client.post("/logout").headers["location"] == "/login"
        assert me(url, copy).status_code == 401
        assert me(url, other).status_code == 200  # only that session ended


@pytest.mark.timeout(180)
def test_a_changed_password_or_scope_ends_the_logins_sessions_on_the_new_configuration(
    serving: Serving, passwords: dict[str, str]
) -> None:
    with serving() as old, http(old) as one, http(old) as another:
        operator = session_of(log_in(one, OPERATOR, passwords[OPERATOR]))
        viewer = session_of(log_in(another, VIEWER, passwords[VIEWER]))
    # Restarted with the same configuration: the sessions outlive the process.
    with serving() as same:
        assert me(same, operator).status_code == 200 and me(same, viewer).status_code == 200
        # A replica with the new configuration beside one with the old (a rolling update).
        new_password = secrets.token_urlsafe(16)
        changed = {"password": new_password,
                   "logins": json.dumps({VIEWER: f"control:{passwords[VIEWER]}"})}  # fmt: skip
        with serving(**changed) as new, http(new) as client:
            assert me(new, operator).status_code == 401
            assert me(new, viewer).status_code == 401
            assert me(same, operator).status_code == 200  # until the old one is replaced
            assert (
                log_in(client, OPERATOR, passwords[OPERATOR])
                .headers["location"]
                .startswith("/login?failed=1")
            )
            fresh = session_of(log_in(client, OPERATOR, new_password))
            assert me(new, fresh).json()["scope"] == "control"
            promoted = session_of(log_in(client, VIEWER, passwords[VIEWER]))
            assert me(new, promoted).json()["scope"] == "control"


@pytest.mark.timeout(120)
def test_an_expired_session_is_refused(serving: Serving, passwords: dict[str, str]) -> None:
    with serving(session_hours=2 / 3600) as url, http(url) as client:
        cookie = session_of(log_in(client, VIEWER, passwords[VIEWER]))
        assert me(url, cookie).status_code == 200
        time.sleep(2.2)
        assert me(url, cookie).status_code == 401


# -- what a client may send --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_cookies_and_headers_it_cannot_read_are_refused_never_a_500(
    serving: Serving, passwords: dict[str, str]
) -> None:
    with serving() as url, http(url) as client:
        good = session_of(log_in(client, OPERATOR, passwords[OPERATOR]))
        tampered = good[:-1] + ("A" if good[-1] != "A" else "B")
        cookies: list[bytes] = [
            f"baton_session={tampered}".encode(),
            f"baton_session={good[:-1]}".encode(),
            b"baton_session=" + good[:-1].encode() + "\u00e9".encode(),
            b"baton_session=\xc3\xa9\xff\xfe" + b"A" * 40,
            b"baton_session=" + "\u2603".encode() * 43,
            b'baton_session="' + good.encode() + b'\\"',
            b"baton_session=" + b"A" * 8000,
            b"baton_browser=\xff; baton_session=\x80",
        ]
        for cookie in cookies:
            with http(url) as fresh:
                api = fresh.get("/api/v1/me", headers={"Cookie": cookie})
                assert api.status_code == 401, (cookie, api.text)
                assert api.json()["error"]["message"] == "log in, or send a bearer token"
                page = fresh.get("/", headers={"Cookie": cookie})
                assert (page.status_code, page.headers["location"]) == (303, "/login?next=/")
        authorizations = [b"Bearer \xc3\xa9", b"Bearer \xff\xfe", b"Bearer " + good.encode(),
                          b"Basic \xe2\x98\x83"]  # fmt: skip
        for authorization in authorizations:
            with http(url) as fresh:
                reply = fresh.get("/api/v1/runs", headers={"Authorization": authorization})
                assert reply.status_code == 401, (authorization, reply.text)
        forms = [
            b"user=%C3%B6perator&password=%C3%A9&next=%2F",
            b"user=operator&password=%FF%FE%ED%A0%80&next=%2F%E2%80%AE",
            b"user=%ED%B0%80&password=\xff\xfe&next=\xc3",
            b"user=operator&password=" + quote(passwords[OPERATOR] + "\u00e9").encode(),
        ]
        for body in forms:
            with http(url) as fresh:
                headers = {"Content-Type": "application/x-www-form-urlencoded"}
                reply = fresh.post("/login", content=body, headers=headers)
                assert reply.status_code == 303, (body, reply.text)
                assert reply.headers["location"].startswith("/login?failed=1&next=")
                assert "baton_session" not in reply.cookies
        assert me(url, good).status_code == 200  # none of it touched the real session


ON_SITE = ["/", "/runs/20261201-120000-abcdef", "/?status=done&q=cart"]
OFF_SITE = [
    f"//{EVIL}", f"/\\{EVIL}", f"\\\\{EVIL}", f"/\t/{EVIL}", f"/\n/{EVIL}", f"https://{EVIL}/",
    "javascript:alert(1)", f"/..//{EVIL}", f" //{EVIL}", f"HTTPS:{EVIL}",
]  # fmt: skip
"""Each of these, given as a Location, takes Chromium off this site (checked below)."""
ENCODED = [f"/%5C{EVIL}", f"/%2F%2F{EVIL}", f"/%2F{EVIL}", f"/%255C{EVIL}", f"/%09/{EVIL}"]
"""These Chromium keeps on this site; one more decoding by a proxy or a page would not."""


@pytest.mark.timeout(180)
def test_a_login_sends_the_browser_on_to_this_site_only(
    serving: Serving, passwords: dict[str, str], browser: webdriver.Chrome
) -> None:
    with serving() as url:
        origin = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
        browser.get(f"{url}/login")

        def resolved(location: str) -> str:
            """Where Chromium goes for this Location on the login page: its URL parser."""
            return str(browser.execute_script("return new URL(arguments[0], location.href).href",
                                              location))  # fmt: skip

        def leaves(href: str) -> bool:
            """Off this site, or onto a path a script reading it would take off (`//host`)."""
            parts = urlsplit(href)
            return f"{parts.scheme}://{parts.netloc}" != origin or parts.path.startswith("//")

        for target in OFF_SITE:  # the control: each is an attack in this browser
            assert leaves(resolved(target)), target
        for target in ENCODED:
            assert not leaves(resolved(target)), target
        for target in ON_SITE + OFF_SITE + ENCODED:
            with http(url) as client:
                form = {"user": OPERATOR, "password": passwords[OPERATOR], "next": target}
                location = client.post("/login", data=form).headers["location"]
            expected = target if target in ON_SITE else "/"
            assert location == expected, target
            assert resolved(location) == f"{origin}{expected}", target

        # Through the form, as a person would: from a link that names /\evil.example.
        browser.get(f"{url}/login?next={quote(f'/{chr(92)}{EVIL}', safe='')}")
        assert browser.find_element(By.ID, "next").get_attribute("value") == f"/\\{EVIL}"
        browser.find_element(By.ID, "user").send_keys(OPERATOR)
        browser.find_element(By.ID, "password").send_keys(passwords[OPERATOR])
        browser.find_element(By.ID, "log-in").click()
        WebDriverWait(browser, 10).until(lambda d: "/login" not in d.current_url)
        assert browser.current_url == f"{origin}/"


@pytest.mark.timeout(180)
def test_cookies_are_secure_when_the_request_came_over_https(
    serving: Serving, passwords: dict[str, str]
) -> None:
    https = {"X-Forwarded-Proto": "https"}

    def flags(reply: httpx.Response) -> list[set[str]]:
        """The attributes of each cookie set, lower-cased, without their values."""
        cookies = reply.headers.get_list("set-cookie")
        assert len(cookies) == 2, cookies  # the session and the browser
        return [{part.strip().split("=")[0].lower() for part in c.split(";")[1:]} for c in cookies]

    with serving() as url, http(url) as client:  # plain HTTP, no proxy believed: the demo
        for attributes in flags(log_in(client, VIEWER, passwords[VIEWER], **https)):
            assert attributes == {"httponly", "max-age", "path", "samesite"}
    with serving(forwarded_allow_ips="127.0.0.1") as url, http(url) as client:
        for attributes in flags(log_in(client, VIEWER, passwords[VIEWER], **https)):
            assert "secure" in attributes
        for attributes in flags(log_in(client, VIEWER, passwords[VIEWER])):
            assert "secure" not in attributes
    with serving(secure_cookies="true") as url, http(url) as client:
        for attributes in flags(log_in(client, VIEWER, passwords[VIEWER])):
            assert "secure" in attributes


@pytest.mark.timeout(60)
def test_every_answer_carries_the_security_headers(serving: Serving) -> None:
    with serving() as url, http(url) as client:
        for path in ("/login", "/", "/api/v1/health", "/api/v1/runs", "/static/login.js"):
            headers = client.get(path).headers
            policy = [d.strip() for d in headers["content-security-policy"].split(";")]
            assert {"base-uri 'none'", "object-src 'none'", "default-src 'self'",
                    "script-src 'self'", "frame-ancestors 'none'"} <= set(policy), path  # fmt: skip
            assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == (
                "nosniff"
            )

"""The pieces of `baton serve`'s logins that need no Redis: where a login may send the browser,
how a client address is counted, secrets compared as bytes whatever a client sends, the
fingerprint that ends a login's sessions when its credential changes, the proxies believed, and
the page that says to wait. The same through a real `baton serve`: tests/integration/
test_serve_security.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from orchestrator.control.server.app import SECURITY_HEADERS, STATIC
from orchestrator.control.server.auth import Authenticator, Principal, ServeSettings
from orchestrator.control.server.limits import client_key
from orchestrator.control.server.login import safe_next, wait_page

ON_SITE = [
    "/",
    "/runs/20261201-120000-abcdef",
    "/runs/20261201-120000-abcdef#stage-fix",
    "/?status=done&q=empty+cart",
    "/runs/%C3%A9t%C3%A9",  # percent-encoded UTF-8: a path, decoded or not
    "/runs/a..b/c.d",
]
OFF_SITE = [
    "//evil.example",
    "//evil.example/path",
    "///evil.example",
    "/\\evil.example",  # browsers read a backslash as a slash: //evil.example
    "\\\\evil.example",
    "/\\/evil.example",
    "/\t/evil.example",  # browsers drop tabs and newlines: //evil.example
    "/\n/evil.example",
    "/\r\n/evil.example",
    "\t//evil.example",
    " /evil.example",
    "https://evil.example",
    "HTTPS://evil.example/",
    "http:/evil.example",
    "http:evil.example",
    "javascript:alert(document.cookie)",
    "JaVaScRiPt:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "evil.example",
    "",
    "/%5Cevil.example",  # each a page or proxy decoding it once more would make off-site
    "/%5cevil.example",
    "/%2F%2Fevil.example",
    "/%2f/evil.example",
    "/%2Fevil.example",
    "/%255Cevil.example",  # twice encoded
    "/%25252F/evil.example",
    "/%09/evil.example",
    "/%0d%0aSet-Cookie:%20x=1",
    "/%00",
    "/..//evil.example",  # the path //evil.example of this site: a script could follow it
    "/./",
    "/runs/..",
    "/%2E%2E//evil.example",
    "/runs/\u00e9",  # not ASCII as given
    "/\uff0f\uff0fevil.example",  # fullwidth solidus
    "/\x00",
    "/\x7f/evil.example",
    "/" + "a" * 2000,
]


@pytest.mark.parametrize("target", ON_SITE)
def test_a_login_goes_on_to_a_path_of_this_site(target: str) -> None:
    assert safe_next(target) == target


@pytest.mark.parametrize("target", OFF_SITE, ids=[repr(t)[:40] for t in OFF_SITE])
def test_a_login_never_goes_to_another_site_however_the_address_is_spelled(target: str) -> None:
    assert safe_next(target) == "/"


@pytest.mark.parametrize(
    ("address", "counted_as"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),  # IPv4 as a dual-stack socket shows it
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same client's /64
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("testclient", "testclient"),
    ],
)
def test_a_client_is_counted_by_its_ipv4_address_or_its_ipv6_network(
    address: str, counted_as: str
) -> None:
    assert client_key(address) == counted_as


def test_passwords_and_tokens_compare_as_bytes_whatever_a_client_sends() -> None:
    auth = Authenticator(
        ServeSettings(
            user="ana", password=SecretStr("pässwörd"), tokens={"ci": SecretStr("read:t0k")}
        )
    )
    assert auth.log_in("ana", "pässwörd") == Principal("ana", "control", "session")
    # What Starlette hands on from a client's bytes: UTF-8 read as Latin-1, lone surrogates,
    # NUL, a prefix, the right one with more after it, very long ones.
    wrong = ["pässwörd".encode().decode("latin-1"), "p\udc80sswörd", "\ud800", "\x00", "pä",
             "pässwörd ", "pässwörd\x00", "é" * 10_000, ""]  # fmt: skip
    for password in wrong:
        assert auth.log_in("ana", password) is None, repr(password)
        assert auth.bearer(password) is None, repr(password)
    assert auth.log_in("\udcff", "pässwörd") is None
    assert auth.bearer("t0k") == Principal("ci", "read", "token")
    assert auth.bearer("t0k\u00e9") is None


def test_a_token_must_be_printable_ascii_as_a_header_carries_it() -> None:
    for token in ["read:tök", "read:two words", "read:tab\there"]:
        with pytest.raises(ValidationError, match="'ci': a token travels in a header"):
            ServeSettings(tokens={"ci": SecretStr(token)})
    ServeSettings(logins={"ana": SecretStr("read:pässwörd mit Leerzeichen")})  # a form carries it


def test_a_session_stands_only_while_its_login_keeps_its_password_scope_and_secret() -> None:
    base = {"logins": {"bo": SecretStr("read:pw-bo")}, "secret": SecretStr("k" * 32)}
    first, replica = Authenticator(ServeSettings(**base)), Authenticator(ServeSettings(**base))
    fingerprint = first.fingerprint("bo")
    assert fingerprint is not None and "pw-bo" not in fingerprint
    assert replica.resume("bo", fingerprint) == Principal("bo", "read", "session")
    changes = {
        "password": {"logins": {"bo": SecretStr("read:pw-bo-2")}},
        "scope": {"logins": {"bo": SecretStr("control:pw-bo")}},
        "secret": {"secret": SecretStr("j" * 32)},
        "removed": {"logins": {"al": SecretStr("read:pw-bo")}},
    }
    for change, update in changes.items():
        assert Authenticator(ServeSettings(**{**base, **update})).resume("bo", fingerprint) is None
        assert first.resume("bo", fingerprint) is not None, change
    assert first.fingerprint("nobody") is None
    assert first.resume("bo", "\udc80é" + fingerprint[2:]) is None  # junk never raises
    # Without a secret each process keys its own: its sessions are its own.
    bare = ServeSettings(logins=base["logins"])
    assert Authenticator(bare).fingerprint("bo") != Authenticator(bare).fingerprint("bo")


@pytest.mark.parametrize("proxies", ["127.0.0.1", "10.0.0.0/8, 192.168.1.10", "::1,fd00::/8", ""])
def test_the_proxies_believed_are_addresses_and_networks(proxies: str) -> None:
    assert ServeSettings(forwarded_allow_ips=proxies).forwarded_allow_ips == proxies


@pytest.mark.parametrize(
    ("proxies", "message"),
    [
        ("*", "'\\*' would believe the first X-Forwarded-For address"),
        ("127.0.0.1,*", "'\\*' would believe"),
        ("10.0.0.1/8", "'10.0.0.1/8' is not an IP address or network"),  # host bits set
        ("ingress.local", "'ingress.local' is not an IP address or network"),
        ("10.0.0.0/33", "'10.0.0.0/33' is not"),
    ],
)
def test_a_proxy_list_uvicorn_would_misread_is_refused(proxies: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServeSettings(forwarded_allow_ips=proxies)


class _Elements(HTMLParser):
    """The attributes and text of the elements with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict[str, str | None]] = {}
        self.text: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if named.get("id"):
            self._open = str(named["id"])
            self.found[self._open] = named
            self.text[self._open] = ""

    def handle_data(self, data: str) -> None:
        if self._open:
            self.text[self._open] += data

    def handle_endtag(self, tag: str) -> None:
        self._open = None


@pytest.mark.parametrize(
    ("retry_after_s", "said"),
    [(840, "Wait 14 minutes"), (61, "Wait 2 minutes"), (42, "Wait 42 seconds")],
)
def test_the_429_page_says_how_long_to_wait_and_keeps_where_to_go(
    retry_after_s: int, said: str
) -> None:
    target = '/?q="><script>x</script>&status=done'
    reply = wait_page(STATIC / "login.html", retry_after_s, target)
    assert reply.status_code == 429
    assert reply.headers["retry-after"] == str(retry_after_s)
    page = _Elements()
    page.feed(bytes(reply.body).decode())
    assert "hidden" not in page.found["login-wait"]
    assert page.text["login-wait"] == f"Too many failed logins. {said} before you try again."
    assert page.found["next"]["value"] == target  # as text: the parser unescaped it
    assert "<script>x" not in bytes(reply.body).decode()
    assert "hidden" in page.found["login-failed"]


def test_the_content_security_policy_forbids_base_and_object_and_keeps_the_rest() -> None:
    directives = {
        d.split()[0]: d.split()[1:] for d in SECURITY_HEADERS["Content-Security-Policy"].split("; ")
    }
    assert directives == {
        "default-src": ["'self'"], "img-src": ["'self'", "data:"], "style-src": ["'self'"],
        "script-src": ["'self'"], "frame-ancestors": ["'none'"], "form-action": ["'self'"],
        "base-uri": ["'none'"], "object-src": ["'none'"],
    }  # fmt: skip


def test_the_settings_table_of_docs_serve_md_names_every_setting_with_its_default() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    rows = [line for line in docs.splitlines() if line.startswith("| `BATON_SERVE_")]
    documented: dict[str, str] = {}
    for row in rows:
        names, default = row.split(" | ")[:2]
        for name in re.findall(r"`BATON_SERVE_(\w+)`", names):
            documented[name.lower()] = default
    assert set(documented) == set(ServeSettings.model_fields)
    for field, default in documented.items():
        literal = re.fullmatch(r"`(.*)`", default)
        if literal:  # a value written as the variable would hold it
            expected = ServeSettings.model_fields[field].get_default(call_default_factory=True)
            assert literal[1] == json.dumps(expected), field

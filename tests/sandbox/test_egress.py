"""The egress proxy's rules and its forwarding, without a network: a fake upstream proxy on a
unix-socket-free loopback listener stands in for the registries (the upstream path applies the
same name rules; the address rules are tested on their own and through `localhost`)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.build import CA_PATH, BuildSettings
from sandbox.clienthello import ENCRYPTED_CLIENT_HELLO
from sandbox.egress import (
    PROXY_URL,
    EgressPolicy,
    EgressProxy,
    Resolver,
    with_registries,
)
from tests.sandbox.test_clienthello import built, extension, real_hello, server_name

REGISTRIES = EgressPolicy(
    hosts=frozenset({"pypi.org", "mirror.example:8443", "localhost", "203.0.113.80"})
)


@pytest.mark.parametrize(
    ("host", "port"),
    [("pypi.org", 443), ("PyPI.org", 80), ("pypi.org.", 443), ("mirror.example", 8443)],
)
def test_a_registry_by_name_on_its_port_is_allowed(host: str, port: int) -> None:
    assert REGISTRIES.refusal(host, port) is None


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("pypi.org", 22),  # not a web port
        ("mirror.example", 443),  # listed with another port
        ("evil.example", 443),
        ("pypi.org.evil.example", 443),
        ("169.254.169.254", 80),  # the cloud metadata service, by address
        ("10.0.0.1", 443),
        ("[::1]", 443),
    ],
)
def test_anything_else_is_refused_by_name(host: str, port: int) -> None:
    assert REGISTRIES.refusal(host, port) is not None


@pytest.mark.parametrize(
    "address",
    ["169.254.169.254", "127.0.0.1", "::1", "fe80::1%eth0", "0.0.0.0", "224.0.0.1",
     "::ffff:169.254.169.254", "::ffff:127.0.0.1"],
)  # fmt: skip
def test_loopback_link_local_and_reserved_addresses_are_always_blocked(address: str) -> None:
    assert EgressPolicy().blocked(address) is not None
    assert EgressPolicy(allow_private=True).blocked(address) is not None


@pytest.mark.parametrize(
    "address", ["10.1.2.3", "172.16.0.9", "192.168.1.1", "100.64.0.1", "fd00::1", "::ffff:10.0.0.1"]
)
def test_private_addresses_are_blocked_unless_private_registries_are_allowed(address: str) -> None:
    assert EgressPolicy().blocked(address) is not None
    assert EgressPolicy(allow_private=True).blocked(address) is None


@pytest.mark.parametrize("address", ["151.101.0.223", "2a04:4e42::223", "203.0.113.80"])
def test_public_addresses_are_not_blocked(address: str) -> None:
    assert EgressPolicy().blocked(address) is None


def test_the_index_and_npm_registry_a_build_names_become_registries() -> None:
    urls = ("https://mirror.corp/simple", "http://npm.corp:4873/", None)
    policy = with_registries(EgressPolicy(hosts=frozenset()), urls)
    assert policy.hosts == {"mirror.corp", "npm.corp:4873"}


def test_a_build_s_commands_see_the_relay_as_their_proxy_and_the_upstream_goes_to_the_proxy() -> (
    None
):
    settings = BuildSettings(index_url="https://mirror.example/simple", proxy="http://proxy:3128")

    env = settings.command_env()

    assert env["PIP_INDEX_URL"] == "https://mirror.example/simple"
    assert env["HTTPS_PROXY"] == env["http_proxy"] == PROXY_URL == "http://127.0.0.1:3128"
    assert env["PIP_CERT"] == env["NODE_EXTRA_CA_CERTS"] == CA_PATH
    assert "http://proxy:3128" not in env.values()
    policy = settings.egress_policy()
    assert policy.upstream == "http://proxy:3128"
    assert {"pypi.org", "mirror.example", "registry.npmjs.org"} <= policy.hosts


class Upstream:
    """A fake upstream proxy on loopback: records each request head and answers `reply`; then
    it echoes what else comes through a tunnel (CONNECT), or closes (a download)."""

    def __init__(self, reply: bytes, address: str = "127.0.0.1") -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self.tunnelled = b""
        self.server = socket.create_server((address, 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://{address}:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            self.heads.append(head)
            conn.sendall(self.reply)
            while head.startswith(b"CONNECT") and (data := conn.recv(4096)):
                self.tunnelled += data
                conn.sendall(data)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = Upstream(b"HTTP/1.1 200 OK\r\n\r\n")
    yield fake
    fake.server.close()


@pytest.fixture
def proxy(tmp_path: Path, upstream: Upstream) -> Iterator[Path]:
    policy = REGISTRIES.model_copy(update={"upstream": upstream.url})
    path = tmp_path / "egress.sock"
    with EgressProxy(policy, path):
        yield path


def ask(path: Path, request: bytes, then: bytes = b"") -> bytes:
    """What the proxy answers `request` on a new connection: until it closes, or with `then`
    sent once the head is in, until `then` comes back."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(request)
        answer = b""
        while not then or b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                return answer
            answer += data
        sock.sendall(then)
        while not answer.endswith(then):
            data = sock.recv(4096)
            if not data:
                break
            answer += data
        return answer


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


@pytest.mark.parametrize(
    ("authority", "server_hostname"),
    [("pypi.org:443", "pypi.org"), ("PyPI.org:443", "pypi.org."), ("203.0.113.80:443", None)],
)
def test_a_connect_to_a_registry_is_tunnelled_through_the_upstream(
    proxy: Path, upstream: Upstream, authority: str, server_hostname: str | None
) -> None:
    hello = real_hello(server_hostname)
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()

    answer = ask(proxy, head, hello)

    assert answer == ESTABLISHED + hello  # the tunnel carries bytes both ways
    assert upstream.heads == [f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()]
    assert upstream.tunnelled == hello


def test_a_client_hello_that_arrives_with_the_head_and_in_pieces_goes_on_whole(
    proxy: Path, upstream: Upstream
) -> None:
    hello = real_hello("pypi.org")
    head = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"

    answer = ask(proxy, head + hello[:7], hello[7:])  # the proxy reads 7 bytes with the head

    assert answer == ESTABLISHED + hello
    assert upstream.tunnelled == hello


@pytest.mark.parametrize(
    ("authority", "first_bytes", "reason"),
    [
        ("pypi.org:443", real_hello("attacker-service.example"),
         "names attacker-service.example, not pypi.org"),
        ("pypi.org:443", real_hello("pypi.org.attacker-service.example"),
         "names pypi.org.attacker-service.example, not pypi.org"),
        ("pypi.org:443", real_hello(None), "names no server, not pypi.org"),
        ("203.0.113.80:443", real_hello("attacker-service.example"),
         "names attacker-service.example, not none"),
        ("pypi.org:443", built(server_name(b"pypi.org") + extension(ENCRYPTED_CLIENT_HELLO, b"x")),
         "an encrypted ClientHello"),
        ("pypi.org:443", b"tls!", "not a TLS handshake record"),
    ],
    ids=["another-name", "a-name-under-it", "no-name", "a-name-for-an-address", "encrypted",
         "not-tls"],
)  # fmt: skip
def test_a_tunnel_whose_client_hello_names_another_server_is_closed_before_it_goes_on(
    proxy: Path,
    upstream: Upstream,
    caplog: pytest.LogCaptureFixture,
    authority: str,
    first_bytes: bytes,
    reason: str,
) -> None:
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()

    answer = ask(proxy, head, first_bytes)

    assert answer == ESTABLISHED  # and then closed, nothing echoed
    assert upstream.tunnelled == b""
    assert f"egress closed a tunnel to {authority}: " in caplog.text
    assert reason in caplog.text


@pytest.mark.parametrize(
    "request_head",
    [
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        b"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT pypi.org:22 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        b"GET http://pypi.org@evil.example/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
    ],
)
def test_a_request_for_anything_but_a_registry_is_refused_and_never_forwarded(
    proxy: Path, upstream: Upstream, request_head: bytes
) -> None:
    answer = ask(proxy, request_head)

    assert answer.startswith(b"HTTP/1.1 403")
    assert b"refused by Baton's egress proxy" in answer
    assert upstream.heads == []


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"POST http://pypi.org/upload HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 0\r\n\r\n",
         b"405"),
        (b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", b"400"),  # not a proxy request
        (b"CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n", b"400"),  # no port
    ],
)  # fmt: skip
def test_what_a_download_never_sends_is_refused(
    proxy: Path, upstream: Upstream, request_head: bytes, status: bytes
) -> None:
    assert ask(proxy, request_head).split(b" ")[1] == status
    assert upstream.heads == []


def test_a_plain_http_download_goes_on_without_proxy_credentials_and_one_per_connection(
    proxy: Path, upstream: Upstream
) -> None:
    answer = ask(
        proxy,
        b"GET http://pypi.org/simple/six/ HTTP/1.1\r\nHost: evil.example\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\nUser-Agent: pip\r\n\r\n"
        b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",  # pipelined
    )

    assert answer.startswith(b"HTTP/1.1 200")
    (head,) = upstream.heads
    assert head == (
        b"GET http://pypi.org/simple/six/ HTTP/1.1\r\nHost: pypi.org\r\n"
        b"user-agent: pip\r\nConnection: close\r\n\r\n"
    )


def an_address_of_this_host() -> str:
    """An IPv4 address of this host's other than loopback, which the proxy would refuse."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # sends nothing: it only picks the outgoing address
        address: str = probe.getsockname()[0]
    assert not address.startswith("127."), "this test needs an address other than loopback"
    return address


@pytest.fixture
def registry() -> Iterator[Upstream]:
    """A registry's web server, reached directly (no upstream proxy), recording each head."""
    fake = Upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", an_address_of_this_host())
    yield fake
    fake.server.close()


@pytest.fixture
def direct_proxy(tmp_path: Path, registry: Upstream) -> Iterator[Path]:
    address = registry.server.getsockname()[0]
    policy = EgressPolicy(hosts=frozenset({f"{address}:{registry.port}"}), allow_private=True)
    path = tmp_path / "egress.sock"
    with EgressProxy(policy, path):
        yield path


DOWNLOAD_HEADERS = [
    ("accept", "text/*"),
    ("accept-encoding", "gzip"),
    ("user-agent", "Debian APT-HTTP/1.3 (2.6.1)"),
    ("cache-control", "max-age=0"),
    ("range", "bytes=100-"),
    ("if-range", "Mon, 07 Dec 2026 00:00:00 GMT"),
    ("if-modified-since", "Mon, 07 Dec 2026 00:00:00 GMT"),
]
"""What apt sends to resume and revalidate a file."""
FORGED_HEADERS = [
    ("Host", "attacker-service.example"),
    ("X-Exfil", "c2VjcmV0LXRva2Vu"),
    ("Authorization", "Basic c2VjcmV0"),
    ("Cookie", "session=c2VjcmV0"),
    ("Proxy-Authorization", "Basic c2VjcmV0"),
    ("Proxy-Connection", "keep-alive"),
    ("Forwarded", "host=attacker-service.example"),
    ("X-Forwarded-Host", "attacker-service.example"),
]


def test_a_plain_http_request_reaches_the_registry_under_its_url_s_host_with_download_headers_only(
    direct_proxy: Path, registry: Upstream
) -> None:
    address = registry.server.getsockname()[0]
    headers = FORGED_HEADERS[:1] + DOWNLOAD_HEADERS + FORGED_HEADERS[1:]
    request = f"GET http://{address}:{registry.port}/debian/dists/InRelease?x=1 HTTP/1.1\r\n"
    request += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"

    answer = ask(direct_proxy, request.encode())

    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
    (head,) = registry.heads
    request_line, *lines = head.decode().split("\r\n")[:-2]
    assert request_line == "GET /debian/dists/InRelease?x=1 HTTP/1.1"
    received = [tuple(line.split(": ", 1)) for line in lines]
    assert received == [
        ("Host", f"{address}:{registry.port}"),
        *DOWNLOAD_HEADERS,
        ("Connection", "close"),
    ]


def test_a_registry_name_that_resolves_to_loopback_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "egress.sock"
    with EgressProxy(REGISTRIES, path):
        answer = ask(path, b"CONNECT localhost:443 HTTP/1.1\r\nHost: localhost\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 403")
    assert b"loopback" in answer


def test_the_socket_is_removed_when_the_proxy_stops(tmp_path: Path) -> None:
    path = tmp_path / "egress.sock"
    with EgressProxy(REGISTRIES, path):
        assert path.is_socket()
    assert not path.exists()


def test_the_resolver_retries_a_temporary_failure_and_remembers_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    answer = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("203.0.113.80", 443))]

    def getaddrinfo(host: str, port: int, **_: object) -> object:
        calls.append(host)
        if len(calls) == 1:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return answer

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr("sandbox.egress.time.sleep", lambda _: None)
    resolver = Resolver()

    assert resolver.addresses("pypi.org", 443) == answer
    assert resolver.addresses("PYPI.org", 443) == answer
    assert calls == ["pypi.org", "pypi.org"]  # one failure, one answer, then remembered


def test_a_name_that_does_not_exist_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def getaddrinfo(host: str, port: int, **_: object) -> object:
        calls.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(socket.gaierror):
        Resolver().addresses("nowhere.example", 443)
    assert calls == ["nowhere.example"]

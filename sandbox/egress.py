"""The egress proxy: a build container's only way out, to the package registries.

    policy = EgressPolicy(hosts=("pypi.org", "files.pythonhosted.org"))
    with EgressProxy(policy, Path("/run/baton-egress/b1.sock")):
        ...  # a build container with the folder bound at EGRESS_PATH, and no network

A build container has no network at all (`NetworkMode: none`, only loopback). Its commands see
`HTTP(S)_PROXY=http://127.0.0.1:3128`, a relay inside the container (`RELAY`, its PID 1's
command) that hands every connection to this proxy's unix socket, bound read-only into the
container. The proxy reads the request head, `CONNECT host:port` for HTTPS or an absolute
`http://` URL for plain HTTP (as apt sends), and connects only when:

- the host is one of the policy's registries, by name (an address literal never is, unless the
  policy names it), on an allowed port; and
- every address the name resolves to is public: never loopback, link-local (the cloud metadata
  address 169.254.169.254), unspecified or multicast, and never a private range (RFC 1918,
  carrier-grade NAT, IPv6 unique local) unless the policy allows private registries.

It connects to the very address it checked, so a name that resolves elsewhere a moment later
cannot redirect it. With an upstream proxy configured it asks that one instead, after the same
name check (the upstream resolves the name). Refusals are answered 403 with the reason and
logged with the host only.

What goes through is held to the registry that was checked, since a CDN routes by the name a
request carries rather than by the address it reached: a plain HTTP request is sent on with
`Host` made from its URL and only the headers a download needs (`FORWARDED_HEADERS`); a tunnel
goes on only for a TLS ClientHello whose server name is the `CONNECT` host (none, for an address
literal; `sandbox.clienthello` reads it), and is closed otherwise, with the reason logged.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import h11
from pydantic import BaseModel, ConfigDict, Field

from sandbox import clienthello
from sandbox.errors import ClientHelloError
from sandbox.sockets import RECV_BYTES, pump

logger = logging.getLogger(__name__)

RELAY_PORT = 3128
"""Where a build container's relay listens, on its loopback."""
PROXY_URL = f"http://127.0.0.1:{RELAY_PORT}"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
"""What points pip, apt, git, curl and npm at the relay."""
DEFAULT_REGISTRIES = (
    "pypi.org",
    "files.pythonhosted.org",
    "deb.debian.org",
    "security.debian.org",
    "registry.npmjs.org",
)
"""Registries every build may reach: PyPI, Debian, npm (`BuildSettings.egress_allow` adds)."""
PUBLIC_PORTS = frozenset({80, 443})
ALWAYS_BLOCKED = tuple(
    ipaddress.ip_network(net)
    for net in ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
                "::/128", "::1/128", "fe80::/10", "ff00::/8")
)  # fmt: skip
"""Loopback, link-local (cloud metadata), unspecified, multicast and reserved addresses."""
PRIVATE = tuple(
    ipaddress.ip_network(net)
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)  # fmt: skip
"""Private ranges: RFC 1918, carrier-grade NAT, IPv6 unique local."""
HEAD_TIMEOUT_S = 30.0
"""Most time a client may take to send its request head."""
CONNECT_TIMEOUT_S = 20.0
IDLE_TIMEOUT_S = 300.0
"""A tunnel with no byte either way for this long is closed."""
MAX_CONNECTIONS = 256
"""Connections served at once (a thread each); one more waits up to `HEAD_TIMEOUT_S` for a
free slot, then is answered 503."""
RESOLVED_TTL_S = 60.0
"""How long a registry's addresses are reused: an install opens hundreds of connections to the
same few names, and a resolver asked for each at once fails some (`EAI_AGAIN`)."""
RESOLVE_ATTEMPTS = 4
MAX_HEAD_BYTES = 16384
MAX_HELLO_READS = 32
"""Reads a tunnel's ClientHello may take (a client writes it at once; a relay passes it in a
few pieces), which bounds the parsing a client that trickles it can cause."""
FORWARDED_HEADERS = frozenset(
    {b"accept", b"accept-encoding", b"accept-language", b"user-agent", b"cache-control",
     b"pragma", b"range", b"if-range", b"if-modified-since", b"if-unmodified-since",
     b"if-none-match", b"if-match"}
)  # fmt: skip
"""The request headers a plain HTTP download is passed on with: what apt, pip and curl send to
negotiate, resume and revalidate a file. Every other header is dropped: `Host` (made from the
URL instead), hop-by-hop and `Proxy-*` headers, `Content-*` (only GET and HEAD are let through,
without a body), `Authorization` and `Cookie` (credentials do not cross a network in clear
text: a registry that needs them is reached over HTTPS, through a tunnel), and any a client
makes up."""

RELAY = """\
import socket, sys, threading, time
path, port, ttl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def pump(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(client):
    with client, socket.socket(socket.AF_UNIX) as proxy:
        try:
            proxy.connect(path)
        except OSError:
            return
        up = threading.Thread(target=pump, args=(client, proxy), daemon=True)
        up.start()
        pump(proxy, client)
        up.join()
def accept(server):
    while True:
        client, _ = server.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(64)
threading.Thread(target=accept, args=(server,), daemon=True).start()
time.sleep(ttl)
"""
"""A build container's PID 1 command (`python3 -c RELAY <socket> <port> <ttl_s>`): passes each
connection to the proxy's socket, and ends the container after `ttl_s` like `sleep` would."""


class EgressPolicy(BaseModel):
    """Where a build may connect."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: frozenset[str] = Field(default_factory=lambda: frozenset(DEFAULT_REGISTRIES))
    """Registry names (`pypi.org`), or `name:port` for a port other than 80 and 443."""
    allow_private: bool = False
    """Let a registry name resolve to a private address (a mirror inside the network);
    loopback and link-local addresses stay refused."""
    upstream: str | None = None
    """`http://host:port` of a proxy to ask instead of connecting directly."""

    def refusal(self, host: str, port: int) -> str | None:
        """Why `host:port` is not a registry of this policy; None if it is."""
        name = host.lower().rstrip(".")
        if f"{name}:{port}" in self.hosts or (name in self.hosts and port in PUBLIC_PORTS):
            return None
        return f"{host}:{port} is not a package registry this build may reach"

    def blocked(self, address: str) -> str | None:
        """Why the build may not connect to `address`; None if it may."""
        ip = ipaddress.ip_address(address.partition("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in ALWAYS_BLOCKED):
            return "a loopback, link-local or reserved address"
        if not self.allow_private and any(ip in net for net in PRIVATE):
            return "a private address"
        return None


def with_registries(policy: EgressPolicy, urls: Iterable[str | None]) -> EgressPolicy:
    """`policy` with the hosts of `urls` (a pip index, an npm registry) added."""
    extra = set()
    for url in urls:
        if url:
            split = urlsplit(url)
            if split.hostname:
                port = "" if split.port is None else f":{split.port}"
                extra.add(f"{split.hostname}{port}")
    return policy.model_copy(update={"hosts": policy.hosts | extra}) if extra else policy


AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


class Resolver:
    """Registry names to addresses, remembered for `RESOLVED_TTL_S`, one lookup at a time per
    name; a temporary failure of the resolver is tried again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[tuple[str, int], tuple[float, list[AddrInfo]]] = {}
        self._busy: dict[tuple[str, int], threading.Lock] = {}

    def addresses(self, host: str, port: int) -> list[AddrInfo]:
        """Raises `OSError` when the name cannot be resolved."""
        key = (host.lower(), port)
        with self._lock:
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:
            found = self._names.get(key)
            if found is not None and found[0] > time.monotonic():
                return found[1]
            infos = self._lookup(host, port)
            self._names[key] = (time.monotonic() + RESOLVED_TTL_S, infos)
            return infos

    @staticmethod
    def _lookup(host: str, port: int) -> list[AddrInfo]:
        attempt = 1
        while True:
            try:
                return list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            except socket.gaierror as exc:
                if exc.errno != socket.EAI_AGAIN or attempt == RESOLVE_ATTEMPTS:
                    raise
            time.sleep(0.2 * 2**attempt)
            attempt += 1


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status, self.reason = status, reason


class EgressProxy:
    """The proxy on a unix socket, served from threads while the `with` block runs."""

    def __init__(self, policy: EgressPolicy, path: Path, *, mode: int = 0o666) -> None:
        self.policy = policy
        self.path = path
        self._mode = mode
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._resolver = Resolver()

    def __enter__(self) -> EgressProxy:
        if self.path.is_socket():
            self.path.unlink()
        server = _Server(str(self.path), _Handler)
        server.proxy = self
        server.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        os.chmod(self.path, self._mode)  # root in a build container connects as another user
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.1,), name="baton-egress", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        if self.path.is_socket():
            self.path.unlink()

    def serve(self, client: socket.socket) -> None:
        """Serve one connection from a build container."""
        client.settimeout(HEAD_TIMEOUT_S)
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request = _read_head(client, http)
            upstream, reply = self._open(request)
        except _Refused as refused:
            logger.warning("egress refused: %s", refused.reason)
            _answer(client, http, refused.status, refused.reason)
            return
        except (h11.ProtocolError, OSError) as exc:
            logger.debug("egress: a client's request ended early: %s", exc)
            return
        with upstream:
            client.sendall(reply)
            if request.method == b"CONNECT":  # on plain HTTP, a pipelined request is not
                target = request.target.decode("ascii", "replace")  # passed on unread
                try:
                    upstream.sendall(_client_hello(client, http.trailing_data[0], target))
                except (_Refused, ClientHelloError) as exc:
                    logger.warning("egress closed a tunnel to %s: %s", target, exc)
                    return
                except OSError as exc:
                    logger.debug("egress: a tunnel ended before its ClientHello: %s", exc)
                    return
            _splice(client, upstream)

    def _open(self, request: h11.Request) -> tuple[socket.socket, bytes]:
        """The connection to the registry for `request`, and what to send the client first."""
        method, target = request.method.decode(), request.target.decode("ascii", "replace")
        if method == "CONNECT":
            host, port = _authority(target)
            self._check(host, port)
            upstream = self._connect(host, port, tunnel=True)
            return upstream, b"HTTP/1.1 200 Connection established\r\n\r\n"
        split = urlsplit(target)
        if split.scheme != "http" or not split.hostname:
            raise _Refused(400, f"{method} {target[:200]}: only CONNECT and http:// URLs")
        if method not in ("GET", "HEAD"):
            raise _Refused(405, f"{method} {split.hostname}: plain HTTP is for downloads only")
        host, port = split.hostname, split.port or 80
        self._check(host, port)
        upstream = self._connect(host, port, tunnel=False)
        upstream.sendall(self._forwarded(request, split.path or "/", split.query, host, port))
        return upstream, b""

    def _check(self, host: str, port: int) -> None:
        reason = self.policy.refusal(host, port)
        if reason is not None:
            raise _Refused(403, reason)

    def _connect(self, host: str, port: int, *, tunnel: bool) -> socket.socket:
        if self.policy.upstream:
            return _through_upstream(self.policy.upstream, host, port, tunnel=tunnel)
        try:
            found = self._resolver.addresses(host, port)
        except OSError as exc:
            raise _Refused(502, f"{host}: cannot resolve it ({exc})") from exc
        addresses = [info[4][0] for info in found]
        for address in addresses:
            reason = self.policy.blocked(str(address))
            if reason is not None:
                raise _Refused(403, f"{host} resolves to {address}, {reason}")
        last: OSError | None = None
        for family, kind, proto, _, sockaddr in found:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(sockaddr)  # the address checked above, not the name again
            except OSError as exc:
                sock.close()
                last = exc
                continue
            sock.settimeout(IDLE_TIMEOUT_S)
            return sock
        raise _Refused(502, f"{host}:{port}: cannot connect ({last})")

    def _forwarded(
        self, request: h11.Request, path: str, query: str, host: str, port: int
    ) -> bytes:
        """The head to send on for a plain HTTP request: origin form, `Host` from the URL, only
        the `FORWARDED_HEADERS`, `Connection: close` (one request per connection)."""
        target = f"{path}?{query}" if query else path
        authority = f"[{host}]" if ":" in host else host
        if port != 80:
            authority = f"{authority}:{port}"
        if self.policy.upstream:
            target = f"http://{authority}{target}"
        lines = [
            f"{request.method.decode()} {target} HTTP/1.1".encode(),
            b"Host: " + authority.encode(),
        ]
        lines += [
            name + b": " + value for name, value in request.headers if name in FORWARDED_HEADERS
        ]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    proxy: EgressProxy
    slots: threading.BoundedSemaphore


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        if not self.server.slots.acquire(timeout=HEAD_TIMEOUT_S):
            reason = f"more than {MAX_CONNECTIONS} connections at once"
            logger.warning("egress: %s; refusing one", reason)
            _answer(self.request, h11.Connection(h11.SERVER), 503, reason)
            return
        try:
            self.server.proxy.serve(self.request)
        finally:
            self.server.slots.release()


def _read_head(client: socket.socket, http: h11.Connection) -> h11.Request:
    while True:
        event = http.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is not h11.NEED_DATA:
            raise OSError(f"no request ({type(event).__name__})")
        http.receive_data(client.recv(RECV_BYTES))


def _client_hello(client: socket.socket, early: bytes, target: str) -> bytes:
    """The bytes a client sent first through its tunnel to `target`, up to the end of its
    ClientHello at least, once that names the tunnel's host as its server (no server, for an
    address literal)."""
    host, _ = _authority(target)
    data = bytes(early)
    deadline = time.monotonic() + HEAD_TIMEOUT_S
    for _ in range(MAX_HELLO_READS):
        hello = clienthello.parse(data)
        if hello is not None:
            break
        client.settimeout(max(deadline - time.monotonic(), 0.001))
        received = client.recv(RECV_BYTES)
        if not received:
            raise ClientHelloError("the client closed before its ClientHello was complete")
        data += received
    else:
        raise ClientHelloError(f"a ClientHello in more than {MAX_HELLO_READS} pieces")
    expected = None if _is_address(host) else host.lower().rstrip(".")
    if hello.server_name != expected:
        named = "no server" if hello.server_name is None else hello.server_name
        raise _Refused(403, f"its ClientHello names {named[:80]}, not {expected or 'none'}")
    client.settimeout(IDLE_TIMEOUT_S)
    return data


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    return True


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _Refused(400, f"CONNECT {target[:200]}: expected host:port")
    return host, int(port)


def _through_upstream(upstream: str, host: str, port: int, *, tunnel: bool) -> socket.socket:
    split = urlsplit(upstream)
    if not split.hostname:
        raise _Refused(502, "the upstream proxy is not an http://host:port URL")
    try:
        sock = socket.create_connection(
            (split.hostname, split.port or 3128), timeout=CONNECT_TIMEOUT_S
        )
    except OSError as exc:
        raise _Refused(502, f"the upstream proxy: {exc}") from exc
    if tunnel:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < MAX_HEAD_BYTES:
            data = sock.recv(1)  # byte by byte: nothing of the tunnel may be read here
            if not data:
                break
            head += data
        status = head.split(b" ", 2)[1:2]
        if status != [b"200"]:
            sock.close()
            raise _Refused(502, f"the upstream proxy refused {host}:{port}: {head[:80]!r}")
    sock.settimeout(IDLE_TIMEOUT_S)
    return sock


def _answer(client: socket.socket, http: h11.Connection, status: int, reason: str) -> None:
    body = f"refused by Baton's egress proxy: {reason}\n".encode()
    headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
               ("Connection", "close")]  # fmt: skip
    try:
        head = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase)
        client.sendall(http.send(head) or b"")
        client.sendall(http.send(h11.Data(data=body)) or b"")
        client.sendall(http.send(h11.EndOfMessage()) or b"")
    except (h11.LocalProtocolError, OSError) as exc:
        logger.debug("egress: could not answer: %s", exc)


def _splice(client: socket.socket, upstream: socket.socket) -> None:
    for sock in (client, upstream):
        sock.settimeout(IDLE_TIMEOUT_S)
    outbound = threading.Thread(target=pump, args=(client, upstream), daemon=True)
    outbound.start()
    pump(upstream, client)
    outbound.join()

"""One client connection of the gate: HTTP/1.1 parsed with h11 on both sides.

A client connection has its own connection to dockerd, opened at its first forwarded request
and kept alive with it. What goes to dockerd is written by the gate: the target `routes.py`
rebuilt, a few headers of its own (never the caller's, but an exec's upgrade), and a body that
`rules.py` rebuilt, or none where a request takes none; an uploaded archive (it may be hundreds
of MB) is spooled, in memory then on disk up to `MAX_ARCHIVE_BYTES`, and forwarded only once
`archive.py` read every member and no member nor the target folder passes through a symbolic
link in the container. Answers come back as dockerd sends them, except a container
list through the ordinary socket, from which build containers are taken out. An exec's
`POST /exec/{id}/start` asks to upgrade the connection; when dockerd answers `101 UPGRADED`,
the gate passes bytes both ways until dockerd ends the stream, passing on a half-close (the end
of a command's stdin) as it comes.

A client must keep up (`ConnectionLimits`): a kept-alive connection with no request for
`idle_timeout_s` is closed, and one whose request head (and JSON body) is not whole
`request_timeout_s` after its first byte, whose archive stalls that long or comes slower than
`MIN_UPLOAD_BYTES_PER_S`, or that does not take an answer, is dropped. An upgraded exec stream
is never cut: a command may be silent for long.
"""

from __future__ import annotations

import json
import logging
import posixpath
import socket
import struct
import tempfile
import time
from typing import IO, cast
from urllib.parse import urlsplit

import docker.errors
import h11
from pydantic import BaseModel, ConfigDict, Field

from sandbox import labels as label
from sandbox.gate import archive
from sandbox.gate.errors import Refused
from sandbox.gate.idle import IdleConnections
from sandbox.gate.lookup import Container, Lookup
from sandbox.gate.peer import Dropped, Peer, splice
from sandbox.gate.policy import GatePolicy, touch_refusal
from sandbox.gate.routes import Refusal, Route, route, unversioned, without_builds
from sandbox.sockets import RECV_BYTES

logger = logging.getLogger(__name__)

Body = bytes | IO[bytes]
"""A request's body as forwarded: bytes the gate rebuilt, or a spooled archive it checked."""

MAX_JSON_BYTES = 1 << 20
"""Most a body the gate reads whole may hold (a container's settings, with its environment)."""
MAX_LIST_BYTES = 64 << 20
"""Most a container list the gate filters may hold."""
MAX_ARCHIVE_BYTES = 2 << 30
"""Most an uploaded archive may hold: it is spooled to the gate's disk before it is checked."""
SPOOL_MEMORY_BYTES = 1 << 20
"""An archive up to this size is spooled in memory; a larger one in a temporary file."""
MIN_UPLOAD_BYTES_PER_S = 1 << 16
"""Slowest an archive upload may come on average, once its first `request_timeout_s` passed
(a client trickling a byte at a time would hold its connection for ever)."""


class ConnectionLimits(BaseModel):
    """How long the gate waits for a client, and how many it serves at once per socket."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_timeout_s: float = Field(30.0, gt=0)
    """From a request's first byte to its whole head (and whole JSON body); also the longest a
    streamed archive or an answer being taken may stall."""
    idle_timeout_s: float = Field(300.0, gt=0)
    """How long a kept-alive connection may wait for its next request."""
    max_connections: int = Field(128, ge=1)
    """Connections served at once on one socket; more wait to be accepted (and are logged)."""


class _Answer(Exception):
    """Raised inside a session when the gate answers a request itself: a refusal, a missing
    container, a daemon it cannot reach."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status, self.message = status, message


class Gate:
    """What every connection shares: the policy, the daemon's address, the lookups."""

    def __init__(self, policy: GatePolicy, docker_url: str, limits: ConnectionLimits) -> None:
        self.policy = policy
        self.docker_url = docker_url
        self.limits = limits
        self.lookup = Lookup(docker_url)
        self.idle = IdleConnections()

    def connect(self) -> socket.socket:
        """A new connection to dockerd."""
        url = urlsplit(self.docker_url)
        if url.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(url.path)
            return sock
        if url.scheme in ("tcp", "http") and url.hostname and url.port:
            return socket.create_connection((url.hostname, url.port))
        raise ValueError(f"--docker must be unix:///path or tcp://host:port, not {self.docker_url}")

    def session(self, sock: socket.socket, *, build_socket: bool) -> None:
        """Serve one client connection until it closes (or is too slow)."""
        client = Peer(sock, h11.SERVER, send_timeout_s=self.limits.request_timeout_s)
        session = _Session(self, client, build_socket=build_socket)
        try:
            while session.serve_one():
                pass
        except Dropped as dropped:
            logger.warning("dropped a connection: %s (--request-timeout-s)", dropped)
        except (h11.ProtocolError, OSError) as exc:
            logger.debug("connection ended: %s", exc)
        finally:
            session.close()


class _Session:
    def __init__(self, gate: Gate, client: Peer, *, build_socket: bool) -> None:
        self.gate = gate
        self.limits = gate.limits
        self.client = client
        self.build_socket = build_socket
        self.upstream: Peer | None = None
        self.deadline = 0.0
        """When the request being read must be whole."""
        self.owner = _peer_owner(client.sock)
        """The `baton.owner` of the process at the other end of the socket, which every
        container it creates carries (None where the socket names no peer)."""

    def serve_one(self) -> bool:
        """Serve the next request; False when the connection is over."""
        if not self.client.http.trailing_data[0]:
            try:
                with self.gate.idle.waiting(self.client.sock, build=self.build_socket):
                    first = self.client.receive(stall_s=self.limits.idle_timeout_s)
            except Dropped:
                logger.debug("closed a connection idle for %.0f s", self.limits.idle_timeout_s)
                return False
            self.client.http.receive_data(first)
        self.deadline = time.monotonic() + self.limits.request_timeout_s
        request = self.client.next_event(self.deadline)
        if not isinstance(request, h11.Request):
            return False
        method, target = request.method.decode(), request.target.decode("latin-1")
        try:
            decided, found, body = self._checked(method, target)
        except _Answer as answer:
            return self._answer(method, target, answer)
        return self._forward(request, decided, decided.target(found.id if found else ""), body)

    def close(self) -> None:
        for peer in (self.client, self.upstream):
            if peer is not None:
                peer.sock.close()

    # -- checks -------------------------------------------------------------------------------

    def _checked(self, method: str, target: str) -> tuple[Route, Container | None, Body]:
        """The route, the container it acts on and the body to forward; `_Answer` if
        refused."""
        decided = route(
            self.gate.policy, method, target, build_socket=self.build_socket, owner=self.owner
        )
        if isinstance(decided, Refusal):
            raise _Answer(403, decided.reason)
        found = self._container(decided)
        if decided.streamed:
            assert found is not None
            return decided, found, self._checked_archive(found.id, decided.archive_path)
        raw = self._read_body()
        if decided.body is None:
            if raw:
                raise _Answer(403, "it has a body, which this request never has")
            return decided, found, b""
        try:
            return decided, found, decided.body(raw, found)
        except Refused as refused:
            raise _Answer(403, refused.reason) from None

    def _container(self, decided: Route) -> Container | None:
        """The container the request acts on, once its labels passed; None if it names none."""
        lookup = self.gate.lookup
        try:
            ref = decided.container
            if decided.exec_id is not None:
                ref = lookup.exec_container(decided.exec_id)
                if ref is None:
                    raise _Answer(404, f"No such exec instance: {decided.exec_id}")
            if ref is None:
                return None
            found = lookup.container(ref)
        except (docker.errors.DockerException, OSError) as exc:
            raise _Answer(502, f"the sandbox gate cannot reach dockerd: {exc}") from exc
        if found is None:
            raise _Answer(404, f"No such container: {ref}")
        reason = touch_refusal(
            found.labels, build_socket=self.build_socket, build_only=decided.build_only
        )
        if reason is not None:
            raise _Answer(403, reason)
        return found

    def _read_body(self) -> bytes:
        body = bytearray()
        while not isinstance(event := self.client.next_event(self.deadline), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise OSError("the client closed the connection mid-request")
            body += event.data
            if len(body) > MAX_JSON_BYTES:
                raise _Answer(413, f"its body is larger than {MAX_JSON_BYTES} bytes")
        return bytes(body)

    def _answer(self, method: str, target: str, answer: _Answer) -> bool:
        """Answer the request with Docker's error shape; the body it sent is read and dropped."""
        path = unversioned(target)
        message = answer.message
        if answer.status in (403, 413):
            socket_name = "build socket" if self.build_socket else "socket"
            message = f"refused by Baton's sandbox gate: {method} {path}: {answer.message}"
            logger.warning("refused %s %s on the %s: %s", method, path, socket_name, answer.message)
        drained_by = time.monotonic() + self.limits.request_timeout_s
        while self.client.http.their_state is h11.SEND_BODY:
            if isinstance(self.client.next_event(drained_by), h11.ConnectionClosed):
                return False
        content = json.dumps({"message": message}).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(content)))]
        self.client.send(
            h11.Response(status_code=answer.status, headers=headers),
            h11.Data(data=content),
            h11.EndOfMessage(),
        )
        return self.client.reusable()

    # -- forwarding ---------------------------------------------------------------------------

    def _forward(self, request: h11.Request, decided: Route, target: str, body: Body) -> bool:
        head = h11.Request(
            method=request.method, target=target.encode(), headers=_headers(request, decided, body)
        )
        try:
            upstream = self._send_head(head)
        except OSError as exc:
            return self._answer(request.method.decode(), target, _Answer(502, f"dockerd: {exc}"))
        if isinstance(body, bytes):
            upstream.send(h11.Data(data=body), h11.EndOfMessage())
        else:
            with body:
                body.seek(0)
                while chunk := body.read(RECV_BYTES * 4):
                    upstream.send(h11.Data(data=chunk))
            upstream.send(h11.EndOfMessage())
        response = upstream.next_event()
        if isinstance(response, h11.InformationalResponse) and response.status_code == 101:
            self.client.send(response)
            splice(self.client, upstream)
            return False
        if not isinstance(response, h11.Response):
            raise OSError(f"dockerd ended the connection ({type(response).__name__})")
        if decided.hides_builds and response.status_code == 200:
            self._send_filtered(response, upstream)
        else:
            self.client.send(response)
            self._stream_body(upstream, self.client)
        if not upstream.reusable():
            upstream.sock.close()
            self.upstream = None
        return self.client.reusable()

    def _send_head(self, head: h11.Request) -> Peer:
        """Send a request's head to dockerd, on the kept connection if it is still open, else
        on a new one."""
        if self.upstream is not None:
            try:
                self.upstream.send(head)
                return self.upstream
            except OSError:  # dockerd closed it while it was idle
                self.upstream.sock.close()
        self.upstream = Peer(self.gate.connect(), h11.CLIENT)
        self.upstream.send(head)
        return self.upstream

    def _send_filtered(self, response: h11.Response, upstream: Peer) -> None:
        """Forward a container list without its build containers."""
        listed = bytearray()
        while not isinstance(event := upstream.next_event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data) or len(listed) > MAX_LIST_BYTES:
                raise OSError("dockerd's container list ended early or is too large")
            listed += event.data
        content = without_builds(bytes(listed))
        framing = (b"content-length", b"transfer-encoding")
        headers = [(k, v) for k, v in response.headers if k.lower() not in framing]
        headers.append((b"content-length", str(len(content)).encode()))
        self.client.send(
            h11.Response(status_code=response.status_code, headers=headers, reason=response.reason),
            h11.Data(data=content),
            h11.EndOfMessage(),
        )

    def _checked_archive(self, container_id: str, path: str) -> IO[bytes]:
        """The client's archive, spooled and checked (`archive.py`): none of its members, nor
        the folder `path` it is unpacked into, passes through a symbolic link in the
        container; `_Answer` otherwise."""
        spool = self._spool_upload()
        try:
            try:
                checked = archive.check(spool)
            except Refused as refused:
                raise _Answer(403, refused.reason) from None
            folder = posixpath.normpath(path) if path.startswith("/") else ""
            if not folder:
                raise _Answer(
                    403, f"path {path[:200]!r}: an archive is unpacked at an absolute path"
                )
            parts = folder.split("/")[1:]
            into = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts)) if parts[i]]
            into += [posixpath.join(folder, parent) for parent in checked.parents_to_check]
            for where in into:
                if self._is_link(container_id, where):
                    raise _Answer(403, f"{where!r} is a symbolic link in the container: an "
                                       "archive is never unpacked through one")  # fmt: skip
        except BaseException:
            spool.close()
            raise
        return spool

    def _is_link(self, container_id: str, path: str) -> bool:
        try:
            return self.gate.lookup.is_link(container_id, path)
        except (docker.errors.DockerException, OSError) as exc:
            raise _Answer(502, f"the sandbox gate cannot reach dockerd: {exc}") from exc

    def _spool_upload(self) -> IO[bytes]:
        """The client's archive, in memory up to `SPOOL_MEMORY_BYTES`, on disk beyond, at most
        `MAX_ARCHIVE_BYTES`: it may stall for `request_timeout_s` at most, and must average
        `MIN_UPLOAD_BYTES_PER_S` after its first `request_timeout_s`."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)
        grace_s = self.limits.request_timeout_s
        started, received = time.monotonic(), 0
        try:
            while True:
                due = started + grace_s + received / MIN_UPLOAD_BYTES_PER_S
                event = self.client.next_event(due, stall_s=grace_s)
                if isinstance(event, h11.Data):
                    received += len(event.data)
                    if received > MAX_ARCHIVE_BYTES:
                        raise _Answer(413, f"its archive is larger than {MAX_ARCHIVE_BYTES} bytes")
                    spool.write(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    spool.seek(0)
                    return cast(IO[bytes], spool)
                else:
                    raise OSError(f"the client ended mid-archive ({type(event).__name__})")
        except BaseException:
            spool.close()
            raise

    @staticmethod
    def _stream_body(source: Peer, sink: Peer) -> None:
        while True:
            event = source.next_event()
            if isinstance(event, h11.Data):
                sink.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                sink.send(h11.EndOfMessage())
                return
            else:
                raise OSError(f"the connection ended mid-message ({type(event).__name__})")


def _peer_owner(sock: socket.socket) -> str | None:
    """The `baton.owner` of the process that connected `sock` (a unix socket's SO_PEERCRED:
    its pid in the gate's pid namespace); None when the socket has no such peer."""
    if sock.family != socket.AF_UNIX:
        return None
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return label.owner_of(pid) if pid > 0 else None


UPGRADE_HEADERS = {b"connection": b"upgrade", b"upgrade": b"tcp"}
"""The headers (lower-cased, with their only accepted value) docker-py sends to have an exec's
stream on the connection itself."""


def _headers(request: h11.Request, decided: Route, body: Body) -> list[tuple[bytes, bytes]]:
    """The headers forwarded: the gate's own, an exec's upgrade, and the body's framing."""
    headers = [(b"host", b"docker")]
    if decided.upgrade:
        headers += [
            (name, value)
            for name, value in request.headers
            if UPGRADE_HEADERS.get(name.lower()) == value.lower()
        ]
    if decided.content_type is not None and body != b"":
        headers.append((b"content-type", decided.content_type.encode()))
    if not isinstance(body, bytes):  # a spooled archive
        body.seek(0, 2)
        headers.append((b"content-length", str(body.tell()).encode()))
    elif body:
        headers.append((b"content-length", str(len(body)).encode()))
    return headers

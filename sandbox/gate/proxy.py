"""The gate's server: HTTP/1.1 parsed with h11 on both sides, one thread per connection.

A client connection has its own connection to dockerd, opened at its first forwarded request
and kept alive with it. Bodies are streamed both ways, chunk by chunk, whatever their framing
(an archive may be hundreds of MB), except the small JSON bodies a rule reads. An exec's
`POST /exec/{id}/start` asks to upgrade the connection; when dockerd answers `101 UPGRADED`,
the gate passes bytes both ways until dockerd ends the stream, passing on a half-close (the end
of a command's stdin) as it comes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import stat
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker.errors
import h11

from sandbox.gate.lookup import Lookup
from sandbox.gate.policy import GatePolicy
from sandbox.gate.routes import Refusal, Route, route, unversioned

logger = logging.getLogger(__name__)

RECV_BYTES = 65536
MAX_JSON_BYTES = 1 << 20
"""Most a body a rule reads may hold (a container's settings, with its environment)."""


class _Answer(Exception):
    """Raised inside a session when the gate answers a request itself: a refusal, a missing
    container, a daemon it cannot reach."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status, self.message = status, message


class Peer:
    """One side of a forwarded exchange: a socket and its HTTP state (h11)."""

    def __init__(self, sock: socket.socket, role: type[h11.CLIENT] | type[h11.SERVER]) -> None:
        self.sock = sock
        self.http = h11.Connection(role)

    def next_event(self) -> Any:
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = self.sock.recv(RECV_BYTES)
            except OSError:
                data = b""
            self.http.receive_data(data)

    def send(self, *events: Any) -> None:
        for event in events:
            data = self.http.send(event)
            if data:
                self.sock.sendall(data)

    def reusable(self) -> bool:
        """Both sides ended their message: ready for the next request (the state says so)."""
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
            return True
        return False


class Gate:
    """What every connection shares: the policy, the daemon's address, the lookups."""

    def __init__(self, policy: GatePolicy, docker_url: str) -> None:
        self.policy = policy
        self.docker_url = docker_url
        self.lookup = Lookup(docker_url)

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

    def session(self, sock: socket.socket) -> None:
        """Serve one client connection until it closes."""
        session = _Session(self, Peer(sock, h11.SERVER))
        try:
            while session.serve_one():
                pass
        except (h11.ProtocolError, OSError) as exc:
            logger.debug("connection ended: %s", exc)
        finally:
            session.close()


class _Session:
    def __init__(self, gate: Gate, client: Peer) -> None:
        self.gate = gate
        self.client = client
        self.upstream: Peer | None = None

    def serve_one(self) -> bool:
        """Serve the next request; False when the connection is over."""
        request = self.client.next_event()
        if not isinstance(request, h11.Request):
            return False
        method, target = request.method.decode(), request.target.decode()
        try:
            forwarded, body = self._checked(method, target)
        except _Answer as answer:
            return self._answer(method, target, answer)
        return self._forward(request, forwarded, body)

    def close(self) -> None:
        for peer in (self.client, self.upstream):
            if peer is not None:
                peer.sock.close()

    # -- checks -------------------------------------------------------------------------------

    def _checked(self, method: str, target: str) -> tuple[str, bytes | None]:
        """The target to forward and, if a rule read it, the body; `_Answer` if refused."""
        decided = route(self.gate.policy, method, target)
        if isinstance(decided, Refusal):
            raise _Answer(403, decided.reason)
        forwarded = self._target(decided)
        if decided.body_rule is None:
            return forwarded, None
        raw = self._read_body()
        try:
            body = json.loads(raw or b"{}")
            reason = decided.body_rule(body) if isinstance(body, dict) else "not a JSON object"
        except ValueError:
            reason = "its body is not JSON"
        if reason is not None:
            raise _Answer(403, reason)
        return forwarded, json.dumps(decided.rewrite(body)).encode() if decided.rewrite else raw

    def _target(self, decided: Route) -> str:
        """The target to forward once the container the request acts on passed its checks."""
        lookup = self.gate.lookup
        try:
            ref = decided.container
            if decided.exec_id is not None:
                ref = lookup.exec_container(decided.exec_id)
                if ref is None:
                    raise _Answer(404, f"No such exec instance: {decided.exec_id}")
            if ref is None:
                return decided.target("")
            found = lookup.container(ref)
        except (docker.errors.DockerException, OSError) as exc:
            raise _Answer(502, f"the sandbox gate cannot reach dockerd: {exc}") from exc
        if found is None:
            raise _Answer(404, f"No such container: {ref}")
        for rule in decided.label_rules:
            reason = rule(found.labels)
            if reason is not None:
                raise _Answer(403, reason)
        return decided.target(found.id)

    def _read_body(self) -> bytes:
        body = bytearray()
        while not isinstance(event := self.client.next_event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise OSError("the client closed the connection mid-request")
            body += event.data
            if len(body) > MAX_JSON_BYTES:
                raise _Answer(413, f"its body is larger than {MAX_JSON_BYTES} bytes")
        return bytes(body)

    def _answer(self, method: str, target: str, answer: _Answer) -> bool:
        """Answer the request with Docker's error shape; the body it sent is read and dropped."""
        path = unversioned(urlsplit(target).path)
        message = answer.message
        if answer.status == 403 or answer.status == 413:
            message = f"refused by Baton's sandbox gate: {method} {path}: {answer.message}"
            logger.warning("refused %s %s: %s", method, path, answer.message)
        while self.client.http.their_state is h11.SEND_BODY:
            if isinstance(self.client.next_event(), h11.ConnectionClosed):
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

    def _forward(self, request: h11.Request, target: str, body: bytes | None) -> bool:
        headers = list(request.headers)
        if not any(k.lower() == b"host" for k, _ in headers):  # HTTP/1.0 may leave it out;
            headers.append((b"host", b"docker"))  # HTTP/1.1 to dockerd may not
        if body is not None:
            framing = (b"content-length", b"transfer-encoding")
            headers = [(k, v) for k, v in headers if k.lower() not in framing]
            headers.append((b"content-length", str(len(body)).encode()))
        head = h11.Request(method=request.method, target=target.encode(), headers=headers)
        try:
            upstream = self._send_head(head)
        except OSError as exc:
            return self._answer(request.method.decode(), target, _Answer(502, f"dockerd: {exc}"))
        if body is not None:
            upstream.send(h11.Data(data=body), h11.EndOfMessage())
        else:
            self._stream_body(self.client, upstream)
        response = upstream.next_event()
        if isinstance(response, h11.InformationalResponse) and response.status_code == 101:
            self.client.send(response)
            _splice(self.client, upstream)
            return False
        if not isinstance(response, h11.Response):
            raise OSError(f"dockerd ended the connection ({type(response).__name__})")
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


def _splice(client: Peer, upstream: Peer) -> None:
    """Pass bytes both ways on an upgraded connection until dockerd ends the stream."""
    early_in, _ = client.http.trailing_data
    early_out, _ = upstream.http.trailing_data
    if early_in:
        upstream.sock.sendall(early_in)
    if early_out:
        client.sock.sendall(early_out)
    stdin = threading.Thread(target=_pump, args=(client.sock, upstream.sock), daemon=True)
    stdin.start()
    _pump(upstream.sock, client.sock)
    try:  # dockerd is done: nothing more the client sends can reach the command
        client.sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    stdin.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end `sink`'s writing side (a half-close)."""
    try:
        while data := source.recv(RECV_BYTES):
            sink.sendall(data)
    except OSError as exc:
        logger.debug("exec stream: %s", exc)
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    gate: Gate


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.gate.session(self.request)


def serve(
    policy: GatePolicy,
    *,
    listen: Path,
    docker_url: str = "unix:///var/run/docker.sock",
    socket_mode: int = 0o660,
) -> None:
    """Serve the gate on the unix socket `listen` (replacing a stale one) until interrupted."""
    if listen.is_socket():
        listen.unlink()
    listen.parent.mkdir(parents=True, exist_ok=True)
    gate = Gate(policy, docker_url)
    with _Server(str(listen), _Handler) as server:
        server.gate = gate
        os.chmod(listen, socket_mode)
        logger.info("sandbox gate on %s, forwarding to %s", listen, docker_url)
        try:
            server.serve_forever()
        finally:
            gate.lookup.close()
            if listen.exists() and stat.S_ISSOCK(listen.stat().st_mode):
                listen.unlink()

"""The gate's listening sockets: the ordinary one and, if asked for, the build socket, each
serving at most `max_connections` clients at once, one thread per connection.

Beyond that many, a socket first closes the connection that has waited the longest for its
next request (`idle.py`: its client reconnects); with none idle, it stops accepting: new clients
wait in the kernel's listen backlog (their `connect` succeeds, their request is read once a
connection ends) and the gate logs that it is full, once per time it fills up.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandbox.gate.idle import MIN_IDLE_S
from sandbox.gate.policy import GatePolicy
from sandbox.gate.proxy import ConnectionLimits, Gate

logger = logging.getLogger(__name__)

BACKLOG = 128
"""Connections the kernel holds for a socket while the gate serves `max_connections`."""
ACCEPT_RETRY_S = 0.1
"""How long a socket waits after failing to accept a connection before it tries again."""


@dataclass(frozen=True)
class Listener:
    """One socket the gate listens on."""

    path: Path
    mode: int
    """Its permissions (octal): who may connect is who may write it."""
    build: bool
    """The build socket (`policy.py`)."""

    @property
    def name(self) -> str:
        return "build socket" if self.build else "socket"


def serve(
    policy: GatePolicy,
    *,
    listen: Path,
    build_listen: Path | None = None,
    docker_url: str = "unix:///var/run/docker.sock",
    socket_mode: int = 0o660,
    build_socket_mode: int = 0o600,
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve the gate on the unix socket `listen` (and the build socket `build_listen`),
    replacing stale ones, until interrupted (KeyboardInterrupt); the sockets are removed
    at the end."""
    listeners = [Listener(listen, socket_mode, build=False)]
    if build_listen is not None:
        if build_listen == listen:
            raise ValueError("--build-listen must be another socket than --listen")
        listeners.append(Listener(build_listen, build_socket_mode, build=True))
    gate = Gate(policy, docker_url, limits or ConnectionLimits())
    with ExitStack() as stack:
        stack.callback(gate.lookup.close)
        for listener in listeners:
            sock = stack.enter_context(_bound(listener))
            threading.Thread(
                target=_accept, args=(gate, listener, sock), name=listener.name, daemon=True
            ).start()
            logger.info("sandbox gate: %s %s, forwarding to %s", listener.name, listener.path,
                        docker_url)  # fmt: skip
        threading.Event().wait()  # until SIGINT/SIGTERM raise KeyboardInterrupt here


@contextmanager
def _bound(listener: Listener) -> Iterator[socket.socket]:
    """A socket listening at `listener.path` with its mode from the start (no moment with
    the umask's), removed at the end."""
    path = listener.path
    if path.is_socket():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o777 & ~listener.mode)  # at start-up, before any thread is serving
    try:
        sock.bind(str(path))
    finally:
        os.umask(umask)
    os.chmod(path, listener.mode)
    sock.listen(BACKLOG)
    try:
        yield sock
    finally:
        sock.close()
        if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()


def _accept(gate: Gate, listener: Listener, sock: socket.socket) -> None:
    most = gate.limits.max_connections
    slots = threading.BoundedSemaphore(most)
    while True:
        if not slots.acquire(blocking=False):
            logger.warning("%s: %d connections at once, the most (--max-connections); new ones "
                           "wait to be accepted", listener.name, most)  # fmt: skip
            while not slots.acquire(timeout=MIN_IDLE_S):
                gate.idle.close_oldest(build=listener.build)  # its slot comes back at once
        try:
            conn, _ = sock.accept()
        except OSError as exc:
            slots.release()
            if sock.fileno() == -1:  # closed: the gate is stopping
                return
            logger.warning("%s: cannot accept a connection: %s", listener.name, exc)
            time.sleep(ACCEPT_RETRY_S)  # out of file descriptors, say: it passes
            continue
        threading.Thread(target=_session, args=(gate, listener, conn, slots), daemon=True).start()


def _session(
    gate: Gate, listener: Listener, conn: socket.socket, slots: threading.BoundedSemaphore
) -> None:
    try:
        gate.session(conn, build_socket=listener.build)
    finally:
        slots.release()

"""Client connections kept alive between requests, so that a full socket can make room.

docker-py keeps a pool of connections open between requests. A socket that serves its most
connections at once (`--max-connections`) would otherwise let idle ones hold every slot while a
new client waits in the kernel's backlog until one idles out (`--idle-timeout-s`), long enough
for that client to give up. So a full socket closes the connection idle the longest instead, if
one has been idle for `MIN_IDLE_S`: its client reconnects at its next request, as after an idle
timeout (urllib3 notices a pooled connection its peer closed). An exec stream or a request under
way is never idle, and never closed for room.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

MIN_IDLE_S = 1.0
"""A connection idle for less may be about to send its next request: it is left alone."""


class IdleConnections:
    """The connections of each listener waiting for their next request, oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[bool, OrderedDict[socket.socket, float]] = {
            False: OrderedDict(), True: OrderedDict(),
        }  # fmt: skip

    @contextmanager
    def waiting(self, sock: socket.socket, *, build: bool) -> Iterator[None]:
        """While the block runs, `sock` waits for its next request and may be closed for room."""
        with self._lock:
            self._waiting[build][sock] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._waiting[build].pop(sock, None)

    def close_oldest(self, *, build: bool) -> bool:
        """Close the connection of the listener (`build`: the build socket) idle the longest,
        if any has been for `MIN_IDLE_S`; whether one was."""
        with self._lock:
            waiting = self._waiting[build]
            if not waiting:
                return False
            sock, since = next(iter(waiting.items()))
            if time.monotonic() - since < MIN_IDLE_S:
                return False
            del waiting[sock]
        try:
            sock.shutdown(socket.SHUT_RDWR)  # its session reads the end and gives its slot back
        except OSError:
            pass
        return True

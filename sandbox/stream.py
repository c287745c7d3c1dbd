"""One exec's connection to Docker: output read against deadlines and capped, stdin written.

Without a tty, Docker sends an exec's stdout and stderr over the hijacked HTTP connection in
frames: an 8-byte header (stream type, three zero bytes, payload size as a big-endian uint32),
then the payload. Payloads are kept in arrival order, so stdout and stderr stay interleaved.
Reading never blocks past the deadline it is given: nothing here can hang on a command whose
background child holds stdout open (moby#33039); the caller decides what to do when time is up.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">BxxxL")
RECV_BYTES = 65536


class Capture:
    """At most `limit` bytes of output; whatever comes after is counted and dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0

    def add(self, payload: memoryview) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += payload[:room]
        self.dropped += max(0, len(payload) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


class ExecStream:
    """The socket `exec_start(..., socket=True)` returned, read frame by frame."""

    def __init__(self, sock: Any, capture: Capture) -> None:
        self._io = sock  # docker-py hands back a SocketIO (or the socket itself on some transports)
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        # Blocking: the client's own timeout must not cut a long command short (docker-py#3124);
        # only the selector waits, and always with a deadline.
        self._sock.settimeout(None)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._pending = bytearray()
        self._writer: threading.Thread | None = None
        self.capture = capture
        self.open = True

    def send_stdin(self, data: bytes) -> None:
        """Write `data` to the command's stdin, then close it, from a thread: a command that
        writes a lot before it reads must not deadlock against us."""
        self._writer = threading.Thread(
            target=self._write, args=(data,), name="sandbox-stdin", daemon=True
        )
        self._writer.start()

    def read_until(self, deadline: float) -> bool:
        """Read until end of stream or `deadline` (a `time.monotonic()` value), whichever comes
        first. True while the stream is still open."""
        while self.open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not self._buffered() and not self._selector.select(remaining):
                break
            try:
                data = self._sock.recv(RECV_BYTES)
            except OSError as exc:
                logger.debug("exec stream ended with %s", type(exc).__name__)
                data = b""
            if not data:
                self.open = False
                break
            self._feed(data)
        return self.open

    def close(self) -> None:
        self.open = False
        self._selector.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # also wakes a stdin writer blocked in send
        except OSError:
            pass
        response = getattr(self._io, "_response", None)  # docker-py keeps it alive there
        for closable in (response, self._io, self._sock):
            if closable is not None:
                closable.close()
        if self._writer is not None:
            self._writer.join(timeout=5)

    def _buffered(self) -> bool:
        pending = getattr(self._sock, "pending", None)  # TLS: decrypted bytes select cannot see
        return bool(pending and pending())

    def _feed(self, data: bytes) -> None:
        self._pending += data
        view = memoryview(self._pending)
        start = 0
        while len(view) - start >= FRAME_HEADER.size:
            _, size = FRAME_HEADER.unpack_from(view, start)
            end = start + FRAME_HEADER.size + size
            if end > len(view):
                break
            self.capture.add(view[start + FRAME_HEADER.size : end])
            start = end
        view.release()
        del self._pending[:start]

    def _write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:  # the command ended or closed its stdin first
            logger.debug("stdin not fully written (%d bytes): %s", len(data), type(exc).__name__)

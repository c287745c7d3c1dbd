"""Copying bytes between two sockets, each way, as the sandbox gate's exec streams and the
egress proxy's tunnels do."""

from __future__ import annotations

import logging
import socket

logger = logging.getLogger(__name__)

RECV_BYTES = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end `sink`'s writing side (a half-close)."""
    try:
        while data := source.recv(RECV_BYTES):
            sink.sendall(data)
    except OSError as exc:
        logger.debug("stream ended: %s", exc)
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass

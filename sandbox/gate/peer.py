"""Both ends of what the gate forwards: a socket with its HTTP state, and the spliced stream
of an upgraded exec."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import h11

from sandbox.sockets import RECV_BYTES, pump

logger = logging.getLogger(__name__)


class Dropped(Exception):
    """Raised when a client is too slow: the connection is closed without an answer."""


class Peer:
    """One side of a forwarded exchange: a socket and its HTTP state (h11). A client's reads
    and writes are bounded in time (`deadline`, `send_timeout_s`); dockerd's are not."""

    def __init__(
        self,
        sock: socket.socket,
        role: type[h11.CLIENT] | type[h11.SERVER],
        *,
        send_timeout_s: float | None = None,
    ) -> None:
        self.sock = sock
        self.http = h11.Connection(role)
        self.send_timeout_s = send_timeout_s

    def next_event(self, deadline: float | None = None, *, stall_s: float | None = None) -> Any:
        """The next HTTP event; `Dropped` if it has not come by `deadline` (monotonic), or
        if no byte came for `stall_s`."""
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.http.receive_data(self.receive(deadline, stall_s=stall_s))

    def receive(self, deadline: float | None = None, *, stall_s: float | None = None) -> bytes:
        """What the socket has next (b"" once it is closed); `Dropped` as for `next_event`."""
        waits = [wait for wait in (stall_s, _left(deadline)) if wait is not None]
        self.sock.settimeout(min(waits) if waits else None)
        try:
            return self.sock.recv(RECV_BYTES)
        except TimeoutError:
            raise Dropped("the client was too slow") from None
        except OSError:
            return b""

    def send(self, *events: Any) -> None:
        self.sock.settimeout(self.send_timeout_s)
        for event in events:
            data = self.http.send(event)
            if data:
                try:
                    self.sock.sendall(data)
                except TimeoutError:
                    raise Dropped("the client did not take its answer") from None

    def reusable(self) -> bool:
        """Both sides ended their message: ready for the next request (the state says so)."""
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
            return True
        return False


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)


def splice(client: Peer, upstream: Peer) -> None:
    """Pass bytes both ways on an upgraded connection until dockerd ends the stream."""
    early_in, _ = client.http.trailing_data
    early_out, _ = upstream.http.trailing_data
    for peer in (client, upstream):
        peer.sock.settimeout(None)  # a command may be silent for long: never cut
    if early_in:
        upstream.sock.sendall(early_in)
    if early_out:
        client.sock.sendall(early_out)
    stdin = threading.Thread(target=pump, args=(client.sock, upstream.sock), daemon=True)
    stdin.start()
    pump(upstream.sock, client.sock)
    try:  # dockerd is done: nothing more the client sends can reach the command
        client.sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    stdin.join()

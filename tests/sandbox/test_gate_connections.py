"""The gate keeps up with clients that do not: a real `baton sandbox-gate` drops a client that
sends its request slowly, closes a kept-alive connection left idle, never cuts an exec's
stream however long its command is silent, and serves at most `--max-connections` clients at
once per socket: the rest wait for a busy one, or take the place of the one idle longest."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing

import docker
import pytest

from sandbox import DockerSandbox, SandboxConfig
from tests.sandbox.conftest import TEST_LABEL, Gate, started_gate

REQUEST_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 2.0
PING = b"GET /_ping HTTP/1.1\r\nHost: gate\r\n\r\n"


@pytest.fixture(scope="module")
def gate(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gate]:
    options = ("--request-timeout-s", str(REQUEST_TIMEOUT_S),
               "--idle-timeout-s", str(IDLE_TIMEOUT_S))  # fmt: skip
    with started_gate(tmp_path_factory.mktemp("gate-slow"), *options) as started:
        yield started


def connected(path: object) -> socket.socket:
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(10)
    client.connect(str(path))
    return client


def closed_after(client: socket.socket, *, trickle: bytes = b"", every_s: float = 0.2) -> float:
    """Seconds until the gate closes `client`, sending `trickle` a byte at a time meanwhile."""
    started = time.monotonic()
    client.settimeout(every_s)
    sent = 0
    while True:
        if sent < len(trickle):
            try:
                client.sendall(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
        try:
            if client.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - started
        assert time.monotonic() - started < 10, "the gate never closed the connection"


def answer_to(client: socket.socket, request: bytes = PING) -> bytes:
    client.settimeout(10)
    client.sendall(request)
    answer = b""
    while not answer.endswith(b"OK"):
        chunk = client.recv(4096)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


@pytest.mark.parametrize(
    "trickle",
    [
        b"GET /_ping HTTP/1.1\r\nHost: gate\r\nX-Slow: " + b"a" * 100,
        b"POST /v1.41/containers/create HTTP/1.1\r\nHost: gate\r\nContent-Length: 200\r\n\r\n{"
        + b" " * 100,
    ],
    ids=["head", "json-body"],
)
def test_a_client_sending_its_request_slowly_is_dropped_at_the_bound(
    gate: Gate, trickle: bytes
) -> None:
    """A byte every 0.2 s: never a stall long enough for a per-read timeout, yet the request
    is not whole a second after its first byte."""
    with closing(connected(gate.socket)) as client:
        took = closed_after(client, trickle=trickle)
    assert REQUEST_TIMEOUT_S <= took < REQUEST_TIMEOUT_S + 1.5
    assert "dropped a connection: the client was too slow" in gate.log.read_text()


def test_an_archive_trickled_into_a_sandbox_is_dropped_at_the_bound(
    gate: Gate, session_label: str
) -> None:
    """An archive may stream for long, but not at a byte every 0.2 s."""
    with (
        closing(gate.client()) as client,
        DockerSandbox.start(
            SandboxConfig(), labels={TEST_LABEL: session_label}, client=client
        ) as box,  # fmt: skip
        closing(connected(gate.socket)) as raw,
    ):
        head = (f"PUT /v1.41/containers/{box.id}/archive?path=%2Fworkspace HTTP/1.1\r\n"
                "Host: gate\r\nContent-Length: 10000000\r\n\r\n")  # fmt: skip
        raw.sendall(head.encode())
        took = closed_after(raw, trickle=b"\0" * 100)
    assert REQUEST_TIMEOUT_S <= took < REQUEST_TIMEOUT_S + 1.5


def test_an_idle_connection_is_closed_after_the_idle_bound(gate: Gate) -> None:
    with closing(connected(gate.socket)) as client:
        took = closed_after(client)
    assert IDLE_TIMEOUT_S <= took < IDLE_TIMEOUT_S + 1.5
    with closing(connected(gate.socket)) as client:
        assert answer_to(client).startswith(b"HTTP/1.1 200")
        assert answer_to(client).startswith(b"HTTP/1.1 200")  # kept alive
        took = closed_after(client)
    assert IDLE_TIMEOUT_S <= took < IDLE_TIMEOUT_S + 1.5


def test_docker_py_reconnects_when_the_gate_closed_its_idle_connection(gate: Gate) -> None:
    with closing(gate.client()) as client:
        assert client.ping()
        time.sleep(IDLE_TIMEOUT_S + 0.5)  # its pooled connection is closed meanwhile
        assert client.ping() and client.version()["ApiVersion"]


def test_an_exec_stream_silent_longer_than_every_bound_is_not_cut(
    gate: Gate, session_label: str
) -> None:
    with (
        closing(gate.client()) as client,
        DockerSandbox.start(
            SandboxConfig(), labels={TEST_LABEL: session_label}, client=client
        ) as box,  # fmt: skip
    ):
        silent_s = IDLE_TIMEOUT_S + REQUEST_TIMEOUT_S + 1
        result = box.exec(["sh", "-c", f"echo started; sleep {silent_s}; echo done"],
                          stdin=b"")  # fmt: skip
        assert (result.exit_code, result.output) == (0, "started\ndone\n")
        assert result.duration_s >= silent_s


def test_beyond_the_cap_a_client_waits_for_a_busy_one_and_takes_an_idle_one_s_place(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A connection reading its request is busy and keeps its slot; one waiting for its next
    request is idle, and the longest idle is closed to make room (its client reconnects)."""
    folder = tmp_path_factory.mktemp("gate-capped")
    with started_gate(folder, "--max-connections", "2") as gate, ExitStack() as stack:
        first, second = (stack.enter_context(closing(connected(gate.socket))) for _ in range(2))
        for busy in (first, second):
            busy.sendall(PING[:10])  # a request under way
        third = stack.enter_context(closing(connected(gate.socket)))  # in the backlog
        third.sendall(PING)
        third.settimeout(1.5)
        with pytest.raises(TimeoutError):
            third.recv(4096)
        assert answer_to(first, PING[10:]).startswith(b"HTTP/1.1 200")  # now first idles
        assert answer_to(third, b"").startswith(b"HTTP/1.1 200")  # in first's place
        assert closed_after(first) < 1.0  # closed for room
        assert answer_to(second, PING[10:]).startswith(b"HTTP/1.1 200")  # busy: kept
    assert "socket: 2 connections at once, the most (--max-connections)" in gate.log.read_text()

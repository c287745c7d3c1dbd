"""Sandbox tests run against the real dockerd and the real image: no daemon is a failure."""

from __future__ import annotations

import http.client
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox import DockerSandbox, SandboxConfig, SandboxUnavailableError, ensure_image
from testkit import services

TEST_LABEL = "baton.test"
"""Every container these tests make carries it, with this session's value."""


GATED = "gate:"
"""How the `runtime` of a test run through the sandbox gate begins; the gate's `--runtime`
follows (`gate:runsc` is Compose's sandbox host)."""


def effective_runtime(runtime: str | None) -> str:
    """The OCI runtime a sandbox of `runtime` really runs under."""
    if runtime is None:
        return "runc"
    return runtime.removeprefix(GATED)


def on_each_runtime(*, runsc_fails: str = "") -> pytest.MarkDecorator:
    """Runs a test's sandboxes under dockerd's default runtime (runc), under gVisor's `runsc`,
    which dockerd must have registered (scripts/with-docker.sh does; README, "Sandbox hosts"),
    and through the sandbox gate started with `--runtime runsc` (as Compose runs them) and
    with `--runtime runc`.
    `runsc_fails`: why the test cannot pass under runsc; it is then expected to lose the
    sandbox there (`SandboxUnavailableError`) or to get a result that is not the one runc gives
    (its assertion fails), and reported as an error once it passes."""
    lost_or_other = (SandboxUnavailableError, AssertionError)
    marks = (
        [pytest.mark.xfail(strict=True, raises=lost_or_other, reason=runsc_fails)]
        if runsc_fails
        else []
    )
    return pytest.mark.parametrize(
        "runtime",
        [
            pytest.param(None, id="runc"),
            pytest.param("runsc", id="runsc", marks=marks),
            pytest.param(f"{GATED}runsc", id="gate-runsc", marks=marks),
            pytest.param(f"{GATED}runc", id="gate-runc"),
        ],
    )


@dataclass
class Gate:
    socket: Path
    log: Path
    build_socket: Path | None = None
    """The build socket (`--build-listen`), when the gate was started with one."""

    def client(self) -> docker.DockerClient:
        """A client of the ordinary socket, as a worker holds it."""
        return docker.DockerClient(base_url=f"unix://{self.socket}", timeout=60)

    def builder(self) -> docker.DockerClient:
        """A client of the build socket, as the environment builder holds it."""
        assert self.build_socket is not None, "the gate was started without a build socket"
        return docker.DockerClient(base_url=f"unix://{self.build_socket}", timeout=60)


@contextmanager
def started_gate(folder: Path, *options: str, build_socket: bool = False) -> Iterator[Gate]:
    """`baton sandbox-gate` with `options` on a socket in `folder` (and a build socket there
    too, if asked), stopped at the end."""
    with services.sandbox_gate(folder, *options, build_socket=build_socket) as listen:
        build = folder / services.BUILD_SOCKET if build_socket else None
        yield Gate(listen, folder / "gate.log", build)


class _UnixConnection(http.client.HTTPConnection):
    """http.client over a unix socket (its documented extension point, `connect`)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        super().__init__("docker", timeout=timeout_s)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.socket_path))


def docker_request(
    path: Path, method: str, target: str, body: bytes | None = None, *, timeout_s: float = 60
) -> tuple[int, Any]:
    """Send one request, bytes exactly as given, to the Docker API on the unix socket `path`
    (dockerd's or a gate's): its status and its JSON answer (None when it has none)."""
    connection = _UnixConnection(path, timeout_s)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, json.loads(data) if data.strip() else None


DOCKERD = Path(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://"))
"""dockerd's own socket, for the controls that ask it directly."""

ON_EACH_RUNTIME = on_each_runtime()


@pytest.fixture
def runtime() -> str | None:
    """The OCI runtime `start_sandbox` uses: the daemon's default, unless a test is marked
    `on_each_runtime`."""
    return None


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()  # raises, failing the tests, when dockerd is not running
    ensure_image(client=client)
    yield client
    client.close()


@pytest.fixture(scope="session")
def session_label(docker_client: docker.DockerClient) -> Iterator[str]:
    """A label value unique to this test session; at its end, no container may carry it."""
    value = uuid.uuid4().hex[:12]
    yield value
    left = docker_client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={value}"})
    for container in left:
        docker_client.api.remove_container(container["Id"], force=True, v=True)
    assert [c["Names"] for c in left] == []


@pytest.fixture(scope="session")
def gate_clients(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], docker.DockerClient]]:
    """`client(runtime)`: a client of a sandbox gate in front of dockerd started with
    `--runtime runtime` (as Compose starts it, with runsc); one gate per runtime, started when
    first asked for."""
    with ExitStack() as stack:
        clients: dict[str, docker.DockerClient] = {}

        def client(runtime: str) -> docker.DockerClient:
            if runtime not in clients:
                folder = tmp_path_factory.mktemp(f"gate-{runtime}")
                gate = stack.enter_context(started_gate(folder, "--runtime", runtime))
                clients[runtime] = gate.client()
                stack.callback(clients[runtime].close)
            return clients[runtime]

        yield client


@pytest.fixture
def start_sandbox(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    session_label: str,
    runtime: str | None,
) -> Iterator[Callable[..., DockerSandbox]]:
    """`start_sandbox(memory_mb=128, labels={...}, env={...})`: a running sandbox with these
    settings under `runtime`, removed when the test ends. Through a gate (`GATED`), the
    sandbox asks for no runtime, and is checked to run under the gate's."""
    gated = runtime is not None and runtime.startswith(GATED)
    client = (
        request.getfixturevalue("gate_clients")(effective_runtime(runtime))
        if gated
        else docker_client
    )
    with ExitStack() as stack:

        def start(
            *, labels: dict[str, str] | None = None, env: dict[str, str] | None = None, **cfg: Any
        ) -> DockerSandbox:
            box = stack.enter_context(
                DockerSandbox.start(
                    SandboxConfig(**{"runtime": None if gated else runtime, **cfg}),
                    labels={TEST_LABEL: session_label, **(labels or {})},
                    env=env or {},
                    client=client,
                )
            )
            if gated:
                inspected = docker_client.api.inspect_container(box.id)
                assert inspected["HostConfig"]["Runtime"] == effective_runtime(runtime)
            return box

        yield start


@pytest.fixture
def box(start_sandbox: Callable[..., DockerSandbox]) -> DockerSandbox:
    """A sandbox with the default settings."""
    return start_sandbox()

"""Sandbox tests run against the real dockerd and the real image: no daemon is a failure."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import docker
import pytest

from sandbox import DockerSandbox, SandboxConfig, SandboxUnavailableError, ensure_image

TEST_LABEL = "baton.test"
"""Every container these tests make carries it, with this session's value."""


def on_each_runtime(*, runsc_fails: str = "") -> pytest.MarkDecorator:
    """Runs a test's sandboxes under dockerd's default runtime (runc) and under gVisor's `runsc`,
    which dockerd must have registered (scripts/with-docker.sh does; README, "Sandbox hosts").
    `runsc_fails`: why the test cannot pass under runsc; it is then expected to lose the
    sandbox there (`SandboxUnavailableError`), and reported as an error once it passes."""
    marks = (
        [pytest.mark.xfail(strict=True, raises=SandboxUnavailableError, reason=runsc_fails)]
        if runsc_fails
        else []
    )
    return pytest.mark.parametrize(
        "runtime", [pytest.param(None, id="runc"), pytest.param("runsc", id="runsc", marks=marks)]
    )


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


@pytest.fixture
def start_sandbox(
    docker_client: docker.DockerClient, session_label: str, runtime: str | None
) -> Iterator[Callable[..., DockerSandbox]]:
    """`start_sandbox(memory_mb=128, labels={...}, env={...})`: a running sandbox with these
    settings under `runtime`, removed when the test ends."""
    with ExitStack() as stack:

        def start(
            *, labels: dict[str, str] | None = None, env: dict[str, str] | None = None, **cfg: Any
        ) -> DockerSandbox:
            return stack.enter_context(
                DockerSandbox.start(
                    SandboxConfig(**{"runtime": runtime, **cfg}),
                    labels={TEST_LABEL: session_label, **(labels or {})},
                    env=env or {},
                    client=docker_client,
                )
            )

        yield start


@pytest.fixture
def box(start_sandbox: Callable[..., DockerSandbox]) -> DockerSandbox:
    """A sandbox with the default settings."""
    return start_sandbox()

"""A sandbox's life: labels, removal, the TTL dead-man, the reaper, a daemon that fails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
import pytest

from sandbox import (
    DockerSandbox,
    SandboxConfig,
    SandboxStartError,
    SandboxUnavailableError,
    reap,
)

ROOT = Path(__file__).resolve().parents[2]
OWNER_SCRIPT = """
import sys, time
from sandbox import DockerSandbox, SandboxConfig
with DockerSandbox.start(SandboxConfig(), labels={"baton.test": sys.argv[1]}) as box:
    print(box.id, flush=True)
    time.sleep(600)
"""


def exists(client: docker.DockerClient, container_id: str) -> bool:
    return bool(client.api.containers(all=True, filters={"id": container_id}))


def labelled(client: docker.DockerClient, value: str) -> list[str]:
    found = client.api.containers(all=True, filters={"label": f"baton.test={value}"})
    return [c["Id"] for c in found]


def test_a_sandbox_carries_the_callers_labels_and_its_own(
    start_sandbox: Callable[..., DockerSandbox], docker_client: docker.DockerClient
) -> None:
    before = time.time()
    box = start_sandbox(labels={"baton.run": "r1", "baton.stage": "fix", "baton.attempt": "2"})
    found = docker_client.api.inspect_container(box.id)
    labels = found["Config"]["Labels"]
    assert (labels["baton.sandbox"], labels["baton.run"], labels["baton.stage"]) == (
        "1",
        "r1",
        "fix",
    )
    assert labels["baton.attempt"] == "2"
    assert before + 1800 - 2 <= int(labels["baton.expires"]) <= time.time() + 1800
    host, pid, started = labels["baton.owner"].split(":")
    namespace = os.stat("/proc/self/ns/pid").st_ino
    assert (host, int(pid)) == (f"{socket.gethostname()}/{namespace}", os.getpid())
    assert started.isdigit()
    assert found["Name"].startswith("/baton-sbx-")


def test_the_container_and_its_volume_go_when_the_block_ends(
    docker_client: docker.DockerClient, session_label: str
) -> None:
    with DockerSandbox.start(
        SandboxConfig(), labels={"baton.test": session_label}, client=docker_client
    ) as box:
        mounts = docker_client.api.inspect_container(box.id)["Mounts"]
        (volume,) = [m["Name"] for m in mounts if m["Destination"] == "/workspace"]
        assert exists(docker_client, box.id)
    assert not exists(docker_client, box.id)
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_volume(volume)


def test_the_container_goes_when_the_block_raises(
    docker_client: docker.DockerClient, session_label: str
) -> None:
    with (
        pytest.raises(KeyError, match="boom"),
        DockerSandbox.start(
            SandboxConfig(), labels={"baton.test": session_label}, client=docker_client
        ) as box,
    ):
        raise KeyError("boom")
    assert not exists(docker_client, box.id)


def test_the_container_ends_itself_after_its_ttl(
    start_sandbox: Callable[..., DockerSandbox], docker_client: docker.DockerClient
) -> None:
    box = start_sandbox(ttl_s=3)
    deadline = time.monotonic() + 10
    while exists(docker_client, box.id) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not exists(docker_client, box.id)


def test_a_lost_container_makes_the_sandbox_unavailable(
    box: DockerSandbox, docker_client: docker.DockerClient
) -> None:
    docker_client.api.remove_container(box.id, force=True, v=True)
    with pytest.raises(SandboxUnavailableError, match="gone"):
        box.exec(["true"])


def test_reap_removes_expired_sandboxes_running_or_exited(
    docker_client: docker.DockerClient, session_label: str
) -> None:
    past = {
        "baton.sandbox": "1",
        "baton.expires": str(int(time.time()) - 1),
        "baton.test": session_label,
    }
    running = docker_client.containers.run(
        "baton-sandbox:2", ["sleep", "60"], detach=True, labels=past, network_mode="none"
    )
    exited = docker_client.containers.run(
        "baton-sandbox:2", ["true"], detach=True, labels=past, network_mode="none"
    )
    exited.wait(timeout=10)
    removed = reap(docker_client)
    # Another test session on this host may reap them first: what matters is that they are gone
    # and that reap() reports only what it removed.
    assert not exists(docker_client, running.id)
    assert not exists(docker_client, exited.id)
    assert [cid for cid in removed if exists(docker_client, cid)] == []


def test_reap_removes_the_sandbox_of_a_killed_owner_and_spares_a_live_ones(
    start_sandbox: Callable[..., DockerSandbox],
    docker_client: docker.DockerClient,
    session_label: str,
) -> None:
    mine = start_sandbox()
    orphan_label = f"{session_label}-orphan"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, orphan_label],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    orphan = owner.stdout.readline().strip()
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    assert labelled(docker_client, orphan_label) == [orphan]
    removed = reap(docker_client)
    assert mine.id not in removed
    assert labelled(docker_client, orphan_label) == []
    assert mine.exec(["true"]).exit_code == 0


def test_an_unreachable_daemon_is_unavailable_not_a_crash(session_label: str) -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")
    with (
        pytest.raises(SandboxUnavailableError, match="cannot be reached"),
        DockerSandbox.start(SandboxConfig(), client=client),
    ):
        pass
    with pytest.raises(SandboxUnavailableError):
        reap(client)


def test_an_unreachable_daemon_from_the_environment_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    with pytest.raises(SandboxUnavailableError), DockerSandbox.start(SandboxConfig()):
        pass


def test_a_missing_image_says_how_to_build_it(docker_client: docker.DockerClient) -> None:
    cfg = SandboxConfig(image="baton-sandbox:no-such-version")
    with (
        pytest.raises(SandboxStartError, match=r"python -m sandbox\.image"),
        DockerSandbox.start(cfg, client=docker_client),
    ):
        pass


def test_a_missing_network_is_a_start_error(docker_client: docker.DockerClient) -> None:
    cfg = SandboxConfig(network="baton-no-such-network")
    with (
        pytest.raises(SandboxStartError, match="baton-no-such-network"),
        DockerSandbox.start(cfg, client=docker_client),
    ):
        pass


def test_an_unregistered_runtime_is_a_start_error_saying_how_to_register_it(
    docker_client: docker.DockerClient,
) -> None:
    cfg = SandboxConfig(runtime="baton-no-such-runtime")
    with (
        pytest.raises(SandboxStartError, match=r"baton-no-such-runtime.*daemon\.json.*SIGHUP"),
        DockerSandbox.start(cfg, client=docker_client),
    ):
        pass

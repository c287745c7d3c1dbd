"""A sandbox's workspace is a tmpfs of `workspace_mb`: a write past it fails inside the sandbox
and leaves the host's Docker disk alone; an environment image's seed is copied into it; the
gate refuses a sandbox without that bound or with a larger one than `--max-workspace-mb`."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from sandbox import DockerSandbox, SandboxConfig, SandboxError
from sandbox.docker import WORKSPACE_SEED
from tests.sandbox.conftest import ON_EACH_RUNTIME, TEST_LABEL, Gate, started_gate

pytestmark = pytest.mark.integration

MB = 2**20


@ON_EACH_RUNTIME
def test_a_write_past_the_workspace_fails_there_and_the_host_disk_keeps_its_space(
    start_sandbox: Callable[..., DockerSandbox], docker_client: docker.DockerClient
) -> None:
    box = start_sandbox(workspace_mb=64)
    under = box.exec(["dd", "if=/dev/zero", "of=/workspace/under", "bs=1M", "count=32"])
    assert under.exit_code == 0, under.output  # the control: a write under the limit
    box.exec(["rm", "/workspace/under"])
    docker_root = docker_client.info()["DockerRootDir"]
    free_before = shutil.disk_usage(docker_root).free
    past = box.exec(["dd", "if=/dev/zero", "of=/workspace/past", "bs=1M", "count=400"])
    free_after = shutil.disk_usage(docker_root).free
    assert past.exit_code != 0 and "No space left on device" in past.output, past.output
    assert free_before - free_after < 100 * MB  # 400 MB were written at; at most 64 could land


@pytest.fixture
def seeded_image(docker_client: docker.DockerClient, session_label: str) -> Iterator[str]:
    """An environment-like image whose `WORKSPACE_SEED` holds a 1 MB product owned by
    1000:1000, removed at the end."""
    tag = f"baton-env:test-seed-{uuid.uuid4().hex[:8]}"
    script = (
        f"mkdir -p {WORKSPACE_SEED}/build && echo built > {WORKSPACE_SEED}/build/product.txt && "
        f"head -c 1048576 /dev/zero > {WORKSPACE_SEED}/build/blob && "
        f"chown -R 1000:1000 {WORKSPACE_SEED}"
    )
    container = docker_client.containers.run(
        "baton-sandbox:2", ["sh", "-c", script], user="0:0", detach=True,
        network_mode="none", labels={TEST_LABEL: session_label},
    )  # fmt: skip
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0
        repository, version = tag.split(":")
        container.commit(repository=repository, tag=version, conf={"User": "1000:1000"})
    finally:
        container.remove(force=True, v=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def test_a_sandbox_s_workspace_starts_with_the_image_s_seed_and_one_too_small_is_refused(
    start_sandbox: Callable[..., DockerSandbox], seeded_image: str
) -> None:
    box = start_sandbox(image=seeded_image, workspace_mb=16)
    assert box.exec(["cat", "/workspace/build/product.txt"]).output == "built\n"
    owned = box.exec(["stat", "-c", "%u:%g", "/workspace/build/product.txt"]).output
    assert owned == "1000:1000\n"
    plain = start_sandbox(workspace_mb=16)  # the control: the base image has no seed
    assert plain.exec(["ls", "-A", "/workspace"]).output == ""
    with pytest.raises(SandboxError) as error:
        start_sandbox(image=seeded_image, workspace_mb=1)
    assert "workspace_mb" in str(error.value)


@pytest.fixture(scope="module")
def bounded_gate(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gate]:
    folder: Path = tmp_path_factory.mktemp("gate-workspace")
    with started_gate(folder, "--max-workspace-mb", "128") as started:
        yield started


def test_the_gate_refuses_a_workspace_without_a_size_or_larger_than_its_maximum(
    bounded_gate: Gate, session_label: str
) -> None:
    labels = {TEST_LABEL: session_label}
    client = bounded_gate.client()
    try:
        with pytest.raises(SandboxError) as error:
            with DockerSandbox.start(SandboxConfig(workspace_mb=129), labels=labels, client=client):
                pass
        assert "the workspace's size is 129 MB: between 1 and 128" in str(error.value)
        host_config = client.api.create_host_config(
            network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            read_only=True, mem_limit=64 * MB, memswap_limit=64 * MB, nano_cpus=500_000_000,
            pids_limit=32,
        )  # fmt: skip
        with pytest.raises(docker.errors.APIError) as refused:
            client.api.create_container(
                "baton-sandbox:2", ["sleep", "60"], user="1000:1000", working_dir="/workspace",
                volumes=["/workspace"], labels={"baton.sandbox": "1", **labels},
                host_config=host_config,
            )  # fmt: skip
        assert refused.value.status_code == 403
        assert "never an anonymous volume" in str(refused.value.explanation)
        # the control: at the maximum, the sandbox starts with a workspace of that size
        cfg = SandboxConfig(workspace_mb=128)
        with DockerSandbox.start(cfg, labels=labels, client=client) as box:
            size = box.exec(["df", "-k", "--output=size", "/workspace"]).output.split()[-1]
            assert int(size) == 128 * 1024
    finally:
        client.close()

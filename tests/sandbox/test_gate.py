"""The sandbox gate for real: `baton sandbox-gate` as a subprocess in front of the real dockerd,
Baton's own sandbox code on one side of it (exec with stdin and large output, timeouts, archives
both ways, the warm pool, an environment's build and commit through the build socket), and a
plain docker-py client asking for what Baton never does on the other."""

from __future__ import annotations

import io
import os
import socket
import stat
import tarfile
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from sandbox import DockerSandbox, SandboxConfig, remove_labelled
from sandbox.build import (
    BUILD_CAPABILITIES,
    CA_PATH,
    EGRESS_PATH,
    BuildSettings,
    build_environment,
    environment_tag,
)
from sandbox.environment import EnvironmentSpec
from sandbox.pool import WarmPool
from tests.sandbox.conftest import TEST_LABEL, Gate, docker_request, started_gate

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CANARY = "canary-value-5d1e7b"
HARDENED: dict[str, Any] = {
    "labels": {"baton.sandbox": "1"},
    "user": "1000:1000",
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "mem_limit": "64m",
    "memswap_limit": "64m",
    "nano_cpus": 500_000_000,
    "pids_limit": 32,
    "network_mode": "none",
}
"""A container the gate would let through, short of the one setting each refusal test adds."""


@pytest.fixture(scope="module")
def egress_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stands for the egress proxy's socket folder a build container may see."""
    folder = tmp_path_factory.mktemp("egress")
    (folder / "marker").write_text("egress\n")
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def gate(
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
    egress_folder: Path,
) -> Iterator[Gate]:
    options = ("--allow-ca-bundle", CA_BUNDLE, "--allow-egress-source", str(egress_folder))
    folder = tmp_path_factory.mktemp("gate")
    with started_gate(folder, *options, build_socket=True) as started:
        yield started


@pytest.fixture(scope="module")
def gated(gate: Gate) -> Iterator[docker.DockerClient]:
    """A docker-py client that reaches dockerd only through the gate's ordinary socket, as a
    worker does."""
    client = gate.client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def builder(gate: Gate) -> Iterator[docker.DockerClient]:
    """A docker-py client of the gate's build socket, as the environment builder holds it."""
    client = gate.builder()
    yield client
    client.close()


def build_container(
    client: docker.DockerClient, session_label: str, egress_folder: Path, **changes: Any
) -> str:
    """Create (not start) a build container as `sandbox.build` makes one with the egress proxy:
    root, the build capabilities, no network, the CA bundle and the egress folder read-only."""
    host_config = client.api.create_host_config(
        network_mode="none", cap_drop=["ALL"], cap_add=BUILD_CAPABILITIES,
        security_opt=["no-new-privileges"], pids_limit=512, mem_limit=256 * 2**20,
        memswap_limit=256 * 2**20, nano_cpus=1_000_000_000, init=True,
        binds={CA_BUNDLE: {"bind": CA_PATH, "mode": "ro"},
               str(egress_folder): {"bind": EGRESS_PATH, "mode": "ro"}},
    )  # fmt: skip
    labels = {"baton.sandbox": "1", "baton.build": "1", TEST_LABEL: session_label}
    settings: dict[str, Any] = {
        "command": ["sleep", "120"], "user": "0:0", "working_dir": "/workspace",
        "labels": labels, "host_config": host_config, **changes,
    }  # fmt: skip
    container_id: str = client.api.create_container("baton-sandbox:2", **settings)["Id"]
    return container_id


@pytest.fixture
def plain_container(docker_client: docker.DockerClient, session_label: str) -> Iterator[str]:
    """A running container that is not a sandbox, started on dockerd's own socket."""
    container = docker_client.containers.run(
        "baton-sandbox:2", ["sleep", "60"], detach=True, network_mode="none",
        labels={TEST_LABEL: session_label}, user="1000:1000",
    )  # fmt: skip
    yield container.id
    container.remove(force=True, v=True)


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.gid = len(data), 1000, 1000
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def refused(error: pytest.ExceptionInfo[docker.errors.APIError], *named: str) -> None:
    assert error.value.status_code == 403
    explanation = str(error.value.explanation)
    assert "refused by Baton's sandbox gate" in explanation
    for words in named:
        assert words in explanation


def test_a_sandbox_runs_whole_through_the_gate(
    gated: docker.DockerClient, docker_client: docker.DockerClient, session_label: str
) -> None:
    stdin = os.urandom(3_000_000).hex().encode()  # 6 MB in; 6 MB back, and 4 MB more
    with DockerSandbox.start(SandboxConfig(), labels={TEST_LABEL: session_label},
                             env={"SECRET": CANARY}, client=gated) as box:  # fmt: skip
        echoed = box.exec(["sh", "-c", "cat; head -c 4000000 /dev/zero | tr '\\0' x"],
                          stdin=stdin, max_output_bytes=20_000_000)  # fmt: skip
        assert (echoed.exit_code, echoed.truncated) == (0, False)
        assert echoed.output == stdin.decode() + "x" * 4_000_000

        box.put_archive("/workspace", tar_of({"src/app.py": b"print('in')\n"}))
        assert box.read_file("/workspace/src/app.py", max_bytes=1000) == b"print('in')\n"
        box.write_file("/workspace/out.bin", b"\x00\x01" * 500_000)
        assert box.read_file("/workspace/out.bin", max_bytes=2_000_000) == b"\x00\x01" * 500_000
        assert box.exec(["sh", "-c", "echo $SECRET"]).output == f"{CANARY}\n"

        slow = box.exec(["sleep", "30"], timeout_s=1)
        assert slow.timed_out and slow.exit_code is None
        assert box.exec(["true"]).exit_code == 0
        container_id = box.id
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(container_id)


def test_a_pooled_sandbox_is_taken_and_renamed_through_the_gate(
    gated: docker.DockerClient, docker_client: docker.DockerClient, session_label: str
) -> None:
    pool = WarmPool(size=1, client=gated)
    cfg = SandboxConfig()
    labels = {"baton.run": f"gate{session_label}", "baton.stage": "fix", "baton.attempt": "1"}
    try:
        with pool.start(cfg, labels=labels, env={}) as cold:
            assert cold.exec(["true"]).exit_code == 0
        deadline = time.monotonic() + 15
        while pool.ready() < 1:
            assert time.monotonic() < deadline, "the pool did not fill within 15 s"
            time.sleep(0.05)
        with pool.start(cfg, labels=labels, env={}) as warm:
            name = docker_client.api.inspect_container(warm.id)["Name"]
            assert name.startswith(f"/baton-sbx-gate{session_label}.fix.1-")
            assert warm.exec(["echo", "warm"]).output == "warm\n"
    finally:
        pool.close()


def test_listing_through_the_gate_shows_only_sandboxes(
    gated: docker.DockerClient, plain_container: str, session_label: str
) -> None:
    with DockerSandbox.start(SandboxConfig(), labels={TEST_LABEL: session_label},
                             client=gated) as box:  # fmt: skip
        listed = {c["Id"] for c in gated.api.containers(all=True)}
        mine = {
            c["Id"]
            for c in gated.api.containers(filters={"label": f"{TEST_LABEL}={session_label}"})
        }
        assert box.id in listed and plain_container not in listed
        assert mine == {box.id}
    assert remove_labelled({TEST_LABEL: session_label}, client=gated) == []


def test_an_environment_builds_and_is_removed_through_the_gate(
    gated: docker.DockerClient,
    builder: docker.DockerClient,
    docker_client: docker.DockerClient,
    session_label: str,
    egress_folder: Path,
) -> None:
    spec = EnvironmentSpec(setup=("echo built > /opt/marker",))
    tag = environment_tag(f"gatetest{session_label}")
    settings = BuildSettings(ca_bundle=Path(CA_BUNDLE), egress_dir=egress_folder)
    tree = tar_of({"README": b"a repository\n"})
    built = build_environment(spec, tree, tag=tag, settings=settings,
                              labels={TEST_LABEL: session_label}, client=builder)  # fmt: skip
    try:
        with DockerSandbox.start(SandboxConfig(image=tag), labels={TEST_LABEL: session_label},
                                 client=gated) as box:  # fmt: skip
            assert box.exec(["cat", "/opt/marker"]).output == "built\n"
    finally:
        gated.api.remove_image(tag, force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.api.inspect_image(built.image_id)


def test_what_baton_never_asks_for_is_refused(
    gated: docker.DockerClient, gate: Gate, plain_container: str
) -> None:
    image = "baton-sandbox:2"
    with pytest.raises(docker.errors.APIError) as error:
        gated.containers.create(image, ["true"], privileged=True, **HARDENED)
    refused(error, "POST /containers/create", "Privileged")
    with pytest.raises(docker.errors.APIError) as error:
        gated.containers.create(image, ["true"], volumes={"/": {"bind": "/host", "mode": "rw"}},
                                environment={"SECRET": CANARY}, **HARDENED)  # fmt: skip
    refused(error, "HostConfig.Binds", "/:/host:rw")
    with pytest.raises(docker.errors.APIError) as error:
        gated.containers.create(image, ["true"], **{**HARDENED, "labels": {"x": "1"}})
    refused(error, "baton.sandbox=1")

    with pytest.raises(docker.errors.APIError) as error:
        gated.api.exec_create(plain_container, ["id"])
    refused(error, "not a Baton sandbox")
    with pytest.raises(docker.errors.APIError) as error:
        gated.api.get_archive(plain_container, "/etc/passwd")
    refused(error, "not a Baton sandbox")
    with pytest.raises(docker.errors.APIError) as error:
        gated.api.commit(plain_container, repository="baton-env", tag="stolen")
    refused(error, "only the build socket")

    with pytest.raises(docker.errors.APIError) as error:
        gated.images.build(fileobj=io.BytesIO(b"FROM scratch\n"), tag="baton-env:built")
    refused(error, "POST /build")
    with pytest.raises(docker.errors.APIError) as error:
        gated.images.pull("alpine", tag="3")
    refused(error, "POST /images/create")

    logged = gate.log.read_text()
    assert logged.count("refused ") >= 8
    assert "refused POST /build on the socket: not an API call" in logged
    assert CANARY not in logged


def test_the_gate_s_runtime_is_every_sandbox_s_and_every_build_s(
    docker_client: docker.DockerClient, tmp_path: Path, session_label: str, egress_folder: Path
) -> None:
    options = ("--runtime", "runsc", "--allow-ca-bundle", CA_BUNDLE,
               "--allow-egress-source", str(egress_folder))  # fmt: skip
    with (
        started_gate(tmp_path, *options, build_socket=True) as gate,
        closing(gate.client()) as client,
        closing(gate.builder()) as builder,
    ):
        with DockerSandbox.start(SandboxConfig(runtime=None), labels={TEST_LABEL: session_label},
                                 client=client) as box:  # fmt: skip
            assert docker_client.api.inspect_container(box.id)["HostConfig"]["Runtime"] == "runsc"
            assert box.exec(["echo", "in gvisor"]).output == "in gvisor\n"
        build = build_container(builder, session_label, egress_folder)
        try:
            assert docker_client.api.inspect_container(build)["HostConfig"]["Runtime"] == "runsc"
            builder.api.start(build)
            as_root = DockerSandbox(builder, SandboxConfig(), build, user="0:0")
            seen = as_root.exec(["sh", "-c", f"id -u; cat {EGRESS_PATH}/marker; dmesg | head -1"])
            assert seen.output.splitlines()[:2] == ["0", "egress"]
            assert "gVisor" in seen.output  # runsc's kernel greets in its log
        finally:
            docker_client.api.remove_container(build, force=True, v=True)


def test_a_worker_cannot_create_touch_or_commit_a_build_container_and_the_builder_can(
    gated: docker.DockerClient,
    builder: docker.DockerClient,
    docker_client: docker.DockerClient,
    session_label: str,
    egress_folder: Path,
) -> None:
    with pytest.raises(docker.errors.APIError) as error:
        build_container(gated, session_label, egress_folder)
    refused(error, "only through the build socket")
    build = build_container(builder, session_label, egress_folder)
    tag = f"worker{session_label}"
    try:
        builder.api.start(build)
        for attempt in (
            lambda: gated.api.exec_create(build, ["id"], user="0:0"),
            lambda: gated.api.exec_create(build, ["id"], user="1000:1000"),
            lambda: gated.api.put_archive(build, "/workspace", tar_of({"x": b"x"})),
            lambda: gated.api.inspect_container(build),
            lambda: gated.api.kill(build),
            lambda: gated.api.commit(build, repository="baton-env", tag=tag),
        ):
            with pytest.raises(docker.errors.APIError) as error:
                attempt()
            refused(error)
        assert build not in {c["Id"] for c in gated.api.containers(all=True)}
        assert build in {c["Id"] for c in builder.api.containers(all=True)}

        as_root = DockerSandbox(builder, SandboxConfig(), build, user="0:0")
        as_root.put_archive("/workspace", tar_of({"setup.py": b"print('setup')\n"}))
        assert as_root.exec(["sh", "-c", "id -u; cat /workspace/setup.py"]).output == (
            "0\nprint('setup')\n"
        )
        conf = {"User": "1000:1000", "Cmd": ["sleep", "infinity"], "Labels": {"baton.env.key": tag}}
        image = builder.api.commit(build, repository="baton-env", tag=tag, conf=conf)["Id"]
        try:
            committed = docker_client.api.inspect_image(image)["Config"]
            assert committed["User"] == "1000:1000"
            assert committed["Labels"]["baton.build"] == committed["Labels"]["baton.sandbox"] == ""
            assert committed["Labels"]["baton.env.key"] == tag
        finally:
            docker_client.api.remove_image(image, force=True)
        with pytest.raises(docker.errors.APIError) as error:
            builder.api.commit(build, repository="baton-env", tag=tag, conf={**conf, "User": "0"})
        refused(error, "User '0' is not uid:gid")
    finally:
        docker_client.api.remove_container(build, force=True, v=True)


@pytest.mark.parametrize(
    ("method", "rest", "body", "named"),
    [
        ("POST", "/v1.41/containers/{id}/start", b'{"Dns": ["192.0.2.53"]}', "never has"),
        ("POST", "/v1.23/containers/{id}/start", b'{"Dns": ["192.0.2.53"]}', "API version"),
        ("POST", "/v1.41/containers/{id}/kill", b"signal=KILL", "never has"),
        ("POST", "/v1.41/containers/{id}/stop", b"{}", "never has"),
        ("POST", "/v1.41/containers/{id}/exec", b'{"Cmd": ["id"], "privileged": true}',
         "Privileged is true"),
        ("POST", "/v1.41/containers/{id}/exec", b'{"Cmd": ["id"], "User": "0"}', "User '0'"),
    ],
)  # fmt: skip
def test_a_body_a_request_must_not_have_is_refused_before_dockerd_sees_it(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    method: str,
    rest: str,
    body: bytes,
    named: str,
) -> None:
    box = docker_client.api.create_container(
        "baton-sandbox:2", ["sleep", "60"], user="1000:1000",
        labels={"baton.sandbox": "1", TEST_LABEL: session_label},
        host_config=docker_client.api.create_host_config(
            network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"]
        ),
    )["Id"]  # fmt: skip
    try:
        docker_client.api.start(box)
        status, answer = docker_request(gate.socket, method, rest.format(id=box), body)
        assert status == 403 and named in answer["message"]
        inspected = docker_client.api.inspect_container(box)
        assert inspected["HostConfig"]["CapDrop"] == ["ALL"] and inspected["State"]["Running"]
        assert docker_client.api.inspect_container(box)["ExecIDs"] is None
    finally:
        docker_client.api.remove_container(box, force=True, v=True)


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /_ping HTTP/1.0\r\n\r\n",
        b"GET /_ping HTTP/1.1\r\nHost: gate\r\nConnection: close\r\n\r\n",
    ],
    ids=["http-1.0-without-host", "http-1.1"],
)
def test_a_bare_ping_is_answered_as_compose_s_health_check_sends_it(
    gate: Gate, request_head: bytes
) -> None:
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(10)
        client.connect(str(gate.socket))
        client.sendall(request_head)
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
    status_line, _, _ = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"200", answer[:200]
    assert answer.endswith(b"OK")


def test_each_socket_has_its_own_mode(gate: Gate) -> None:
    """The build socket is the builder's alone (its own user, by default): a worker that holds
    the ordinary socket through its group cannot open it."""
    assert gate.build_socket is not None
    assert stat.S_IMODE(gate.socket.stat().st_mode) == 0o660
    assert stat.S_IMODE(gate.build_socket.stat().st_mode) == 0o600

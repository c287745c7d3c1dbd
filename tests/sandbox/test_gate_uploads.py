"""The gate against real dockerd on two doors a caller could open before: an uploaded archive
that writes through a symbolic link (into the read-only root), makes device nodes or setuid
files; and a container's owner, which the caller used to write itself. Each refusal has its
control: the same request, without what makes it hostile, goes through."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator, Sequence

import docker
import docker.errors
import pytest

from sandbox import DockerSandbox, SandboxConfig, reap
from sandbox import labels as label
from sandbox.docker import workspace_mount
from tests.sandbox.conftest import TEST_LABEL, Gate, started_gate

pytestmark = pytest.mark.integration

FILE, DIR, SYM = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE


@pytest.fixture(scope="module")
def gate(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gate]:
    with started_gate(tmp_path_factory.mktemp("gate")) as started:
        yield started


@pytest.fixture(scope="module")
def gated(gate: Gate) -> Iterator[docker.DockerClient]:
    client = gate.client()
    yield client
    client.close()


@pytest.fixture
def gated_box(gated: docker.DockerClient, session_label: str) -> Iterator[DockerSandbox]:
    """A default sandbox started through the gate."""
    with DockerSandbox.start(
        SandboxConfig(), labels={TEST_LABEL: session_label}, client=gated
    ) as box:
        yield box


def tar_of(members: Sequence[tuple[str, bytes, str]], *, mode: int = 0o644) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as written:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type, info.uid, info.gid = kind, 1000, 1000
            info.mode = 0o755 if kind == DIR else mode
            data = payload.encode() if kind == FILE else None
            if kind == SYM:
                info.linkname = payload
            if data is not None:
                info.size = len(data)
            written.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def refused_upload(client: docker.DockerClient, box: DockerSandbox, path: str, raw: bytes) -> str:
    with pytest.raises(docker.errors.APIError) as error:
        client.api.put_archive(box.id, path, raw)
    assert error.value.status_code == 403
    explanation = str(error.value.explanation)
    assert "refused by Baton's sandbox gate" in explanation
    return explanation


def listing(box: DockerSandbox, *paths: str) -> str:
    return box.exec(["ls", "-ln", "--", *paths]).output


HOSTILE = [
    ([("esc", SYM, "/etc"), ("esc/pwned", FILE, "owned\n")], "member 'esc'", "absolute path"),
    ([("node", tarfile.CHRTYPE, "")], "member 'node'", "a character device"),
    ([("pipe", tarfile.FIFOTYPE, "")], "member 'pipe'", "a fifo"),
]


@pytest.mark.parametrize(
    ("hostile", "member", "words"), HOSTILE, ids=["symlink-to-etc", "device", "fifo"]
)
def test_a_hostile_archive_is_refused_and_writes_nothing_and_the_same_without_it_is_written(
    docker_client: docker.DockerClient,
    gated: docker.DockerClient,
    gated_box: DockerSandbox,
    hostile: list[tuple[str, bytes, str]],
    member: str,
    words: str,
) -> None:
    benign = [("keep", DIR, ""), ("keep/file.txt", FILE, "kept\n")]
    diff_before = docker_client.api.diff(gated_box.id)
    explanation = refused_upload(gated, gated_box, "/workspace", tar_of([*benign, *hostile]))
    assert member in explanation and words in explanation
    assert docker_client.api.diff(gated_box.id) == diff_before
    assert gated_box.exec(["ls", "-A", "/workspace"]).output == ""
    assert gated_box.exec(["test", "-e", "/etc/pwned"]).exit_code == 1
    gated.api.put_archive(gated_box.id, "/workspace", tar_of(benign))  # the control
    assert gated_box.exec(["cat", "/workspace/keep/file.txt"]).output == "kept\n"


def test_a_setuid_file_is_refused_and_the_same_file_without_the_bit_is_written(
    gated: docker.DockerClient, gated_box: DockerSandbox
) -> None:
    explanation = refused_upload(
        gated, gated_box, "/workspace", tar_of([("tool", FILE, "x")], mode=0o4755)
    )
    assert "member 'tool'" in explanation and "setuid or setgid" in explanation
    assert gated_box.exec(["test", "-e", "/workspace/tool"]).exit_code == 1
    gated.api.put_archive(gated_box.id, "/workspace", tar_of([("tool", FILE, "x")], mode=0o755))
    assert listing(gated_box, "/workspace/tool").startswith("-rwxr-xr-x ")


def test_an_upload_through_a_symlink_the_sandbox_made_is_refused_and_through_a_folder_is_written(
    docker_client: docker.DockerClient, gated: docker.DockerClient, gated_box: DockerSandbox
) -> None:
    made = gated_box.exec(["sh", "-c", "ln -s /etc /workspace/esc && mkdir /workspace/real"])
    assert made.exit_code == 0, made.output
    diff_before = docker_client.api.diff(gated_box.id)
    through = tar_of([("esc/pwned", FILE, "owned\n")])
    explanation = refused_upload(gated, gated_box, "/workspace", through)
    assert "'/workspace/esc' is a symbolic link in the container" in explanation
    explanation = refused_upload(gated, gated_box, "/workspace/esc", tar_of([("pwned", FILE, "x")]))
    assert "'/workspace/esc' is a symbolic link in the container" in explanation
    assert docker_client.api.diff(gated_box.id) == diff_before
    assert gated_box.exec(["test", "-e", "/etc/pwned"]).exit_code == 1
    gated.api.put_archive(gated_box.id, "/workspace", tar_of([("real/pwned", FILE, "owned\n")]))
    assert gated_box.exec(["cat", "/workspace/real/pwned"]).output == "owned\n"


# -- the owner ----------------------------------------------------------------------------------

CREATE_SCRIPT = """
import sys, docker
from sandbox import SandboxConfig
from sandbox.docker import workspace_mount
client = docker.DockerClient(base_url="unix://" + sys.argv[1])
host = client.api.create_host_config(
    network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
    mem_limit=64 * 2**20, memswap_limit=64 * 2**20, nano_cpus=500_000_000, pids_limit=32,
    mounts=[workspace_mount(SandboxConfig())])
created = client.api.create_container(
    "baton-sandbox:2", ["sleep", "60"], user="1000:1000", host_config=host,
    working_dir="/workspace",
    labels={"baton.sandbox": "1", "baton.owner": sys.argv[2], "baton.test": sys.argv[3]})
print(created["Id"])
"""
"""Creates a container through the gate's socket `argv[1]` writing `baton.owner` = `argv[2]`
itself, prints its id and exits."""


def test_the_gate_stamps_the_creating_process_as_owner_and_the_reaper_judges_by_it(
    docker_client: docker.DockerClient, gate: Gate, session_label: str
) -> None:
    me = label.owner()
    host = me.rsplit(":", 2)[0]
    process = subprocess.Popen(
        [sys.executable, "-c", CREATE_SCRIPT, str(gate.socket), me, session_label],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    orphan = out.strip()
    # it wrote this (live) process as owner; the gate stamped the one that asked, now dead
    stamped = docker_client.api.inspect_container(orphan)["Config"]["Labels"]["baton.owner"]
    assert stamped.startswith(f"{host}:{process.pid}:") and stamped != me
    # the control: this live process asks, writing the dead one as owner
    dead = f"{host}:{process.pid}:1"
    kept = create_through(gate, dead, session_label)
    try:
        assert docker_client.api.inspect_container(kept)["Config"]["Labels"]["baton.owner"] == me
        removed = reap(docker_client)
        assert kept not in removed
        # Gone: removed by this reap, or by a reaper of a test running beside this one (each
        # judges by the same stamp), which may have come first.
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(orphan)
        assert docker_client.api.inspect_container(kept)["Id"] == kept
    finally:
        docker_client.api.remove_container(kept, force=True, v=True)


def create_through(gate: Gate, forged_owner: str, session_label: str) -> str:
    """A container this process creates through the gate, writing `forged_owner` itself."""
    client = gate.client()
    try:
        host = client.api.create_host_config(
            network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            read_only=True, mem_limit=64 * 2**20, memswap_limit=64 * 2**20,
            nano_cpus=500_000_000, pids_limit=32, mounts=[workspace_mount(SandboxConfig())],
        )  # fmt: skip
        labels = {"baton.sandbox": "1", "baton.owner": forged_owner, TEST_LABEL: session_label}
        created = client.api.create_container(
            "baton-sandbox:2", ["sleep", "60"], user="1000:1000", host_config=host,
            labels=labels, working_dir="/workspace",
        )  # fmt: skip
        return str(created["Id"])
    finally:
        client.close()


def test_without_the_gate_the_symlink_archive_writes_into_the_read_only_root(
    docker_client: docker.DockerClient, start_sandbox: Callable[..., DockerSandbox]
) -> None:
    """The control of the refusals above: the hazard is dockerd's own, so the same archive sent
    straight to it writes `/etc/pwned` into a sandbox's read-only root."""
    box = start_sandbox()
    hostile = tar_of([("esc", SYM, "/etc"), ("esc/pwned", FILE, "owned\n")])
    docker_client.api.put_archive(box.id, "/workspace", hostile)
    assert {"Kind": 1, "Path": "/etc/pwned"} in (docker_client.api.diff(box.id) or [])
    assert box.exec(["cat", "/etc/pwned"]).output == "owned\n"

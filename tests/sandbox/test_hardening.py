"""What a command in a sandbox cannot do: reach a network, write the image, gain privileges,
see the host's environment."""

from __future__ import annotations

from collections.abc import Callable

import docker
import pytest

from sandbox import DockerSandbox
from tests.sandbox.conftest import ON_EACH_RUNTIME, effective_runtime

pytestmark = ON_EACH_RUNTIME


NO_ROUTE = ("[Errno 101] Network is unreachable", "[Errno 113] No route to host")
"""What connecting anywhere fails with: there is no route (not a refusal, not a time-out). The
host's kernel (runc) says ENETUNREACH, gVisor's network stack EHOSTUNREACH."""


def test_the_network_is_unreachable(box: DockerSandbox) -> None:
    connect = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"
    result = box.exec(["python3", "-c", connect], timeout_s=10)
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].removeprefix("OSError: ") in NO_ROUTE


def test_names_do_not_resolve(box: DockerSandbox) -> None:
    resolve = "import socket; socket.getaddrinfo('deb.debian.org', 80)"
    result = box.exec(["python3", "-c", resolve], timeout_s=10)
    assert result.exit_code == 1
    assert "socket.gaierror" in result.output


def test_only_the_loopback_interface_exists(box: DockerSandbox) -> None:
    # asked of the kernel (gVisor's has no /sys/class/net)
    result = box.exec(["python3", "-c", "import socket; print(socket.if_nameindex())"])
    assert result.output == "[(1, 'lo')]\n"


@pytest.mark.parametrize("path", ["/etc/x", "/usr/x", "/home/x", "/x", "/usr/bin/python3"])
def test_the_root_file_system_is_read_only(
    box: DockerSandbox, docker_client: docker.DockerClient, path: str
) -> None:
    write = ["sh", "-c", 'echo x > "$1"', "sh", path]
    assert box.exec(write).exit_code != 0
    # Root owns these paths, so only a read-only mount stops it (gVisor checks permissions
    # first: uid 1000 is told "Permission denied" there, whatever the mount).
    as_owner = DockerSandbox(docker_client, box.cfg, box.id, user="0:0").exec(write)
    assert as_owner.exit_code != 0
    assert "Read-only file system" in as_owner.output


@pytest.mark.parametrize("path", ["/workspace/x", "/tmp/x"])
def test_the_workspace_and_tmp_are_writable(box: DockerSandbox, path: str) -> None:
    assert box.exec(["sh", "-c", 'echo written > "$1"', "sh", path]).exit_code == 0
    assert box.exec(["cat", path]).output == "written\n"


def test_tmp_is_bounded_by_its_size(start_sandbox: Callable[..., DockerSandbox]) -> None:
    box = start_sandbox(tmp_size_mb=4)
    result = box.exec(["sh", "-c", "head -c 8000000 /dev/zero > /tmp/big"])
    assert result.exit_code != 0
    assert "No space left on device" in result.output


def test_commands_run_as_uid_1000_with_no_capabilities(box: DockerSandbox) -> None:
    assert box.exec(["id", "-u"]).output == "1000\n"
    assert box.exec(["id", "-g"]).output == "1000\n"
    status = dict(
        line.split(":\t", 1) for line in box.exec(["cat", "/proc/self/status"]).output.splitlines()
    )
    assert {key: status[key].strip() for key in ("CapEff", "CapPrm", "CapBnd")} == {
        "CapEff": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapBnd": "0000000000000000",
    }
    # prctl(PR_GET_NO_NEW_PRIVS): gVisor's /proc/self/status has no NoNewPrivs line
    no_new_privs = "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"
    assert box.exec(["python3", "-c", no_new_privs]).output == "1\n"


def test_the_environment_holds_only_what_was_passed(
    start_sandbox: Callable[..., DockerSandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_CANARY_SECRET", "canary-4f1c")
    box = start_sandbox(env={"GIVEN_AT_START": "a"})
    result = box.exec(["env"], env={"GIVEN_PER_COMMAND": "b"})
    seen = dict(line.split("=", 1) for line in result.output.splitlines())
    assert "canary-4f1c" not in result.output
    assert set(seen) == {
        "GIVEN_AT_START",
        "GIVEN_PER_COMMAND",
        "HOME",
        "HOSTNAME",
        "LANG",
        "PATH",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",
    }
    assert (seen["GIVEN_AT_START"], seen["GIVEN_PER_COMMAND"], seen["HOME"]) == ("a", "b", "/tmp")


def test_the_container_is_configured_with_every_limit(
    start_sandbox: Callable[..., DockerSandbox],
    docker_client: docker.DockerClient,
    runtime: str | None,
) -> None:
    box = start_sandbox(memory_mb=300, cpus=0.5, pids_limit=100, log_max_size="2m")
    host = docker_client.api.inspect_container(box.id)["HostConfig"]
    assert {
        "NetworkMode": host["NetworkMode"],
        "CapDrop": host["CapDrop"],
        "SecurityOpt": host["SecurityOpt"],
        "ReadonlyRootfs": host["ReadonlyRootfs"],
        "Memory": host["Memory"],
        "MemorySwap": host["MemorySwap"],
        "NanoCpus": host["NanoCpus"],
        "PidsLimit": host["PidsLimit"],
        "Init": host["Init"],
        "Privileged": host["Privileged"],
        "LogConfig": host["LogConfig"],
        "Runtime": host["Runtime"],
    } == {
        "NetworkMode": "none",
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "ReadonlyRootfs": True,
        "Memory": 300 * 2**20,
        "MemorySwap": 300 * 2**20,
        "NanoCpus": 500_000_000,
        "PidsLimit": 100,
        "Init": True,
        "Privileged": False,
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "2m"}},
        "Runtime": effective_runtime(runtime),
    }

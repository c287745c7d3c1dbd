"""A build container reaches the package index and nothing else: not a link-local address (where
clouds serve their metadata), not a private one.

The addresses are the test's own: a network namespace it makes, joined to this host by a veth
pair, holds a listener on a private (10.213.0.2) and a link-local (169.254.213.2) address. The
controls show the listeners answer this host and a container on Docker's default bridge (where
builds used to run). Then a real build (`sandbox.build.build_environment`, under runc and under
gVisor as Compose runs it) tries both addresses directly and through its proxy, by address and
by a name the egress settings list, and downloads a package from the index; the listeners count
every connection they get. No packet goes to an address that is not the test's own or the local
package registry's.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandbox.build import BuildSettings, build_environment, environment_tag
from sandbox.environment import EnvironmentSpec
from testkit.projects import tree_tar
from tests.sandbox.conftest import TEST_LABEL

PRIVATE, LINK_LOCAL, PORT = "10.213.0.2", "169.254.213.2", 8080
LISTENER = textwrap.dedent("""
    import socket, sys, threading
    count = 0
    lock = threading.Lock()
    def serve(address):
        global count
        server = socket.create_server((address, int(sys.argv[3])))
        while True:
            conn, _ = server.accept()
            with lock:
                count += 1
                print(count, flush=True)
            conn.settimeout(2)
            try:
                conn.recv(4096)  # the request, if any: unread, closing would reset
            except OSError:
                pass
            conn.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\nlistener-reached")
            conn.close()
    for address in sys.argv[1:3]:
        threading.Thread(target=serve, args=(address,), daemon=True).start()
    threading.Event().wait()
""")
"""Answers on both addresses and prints the running count of connections it took."""
PROBE = (
    textwrap.dedent("""
    import os, socket, urllib.request
    def direct(address):
        try:
            socket.create_connection((address, PORT), timeout=5).close()
            return "reached"
        except OSError as exc:
            return f"failed {exc.__class__.__name__}"
    def proxied(url):
        try:
            with urllib.request.urlopen(url, timeout=20) as answer:
                return f"reached {answer.read()[:40]!r}"
        except urllib.error.HTTPError as exc:
            return f"refused {exc.code} {exc.read()[:120]!r}"
        except OSError as exc:
            return f"failed {exc}"
    for address in (PRIVATE, LINK_LOCAL):
        print(f"direct {address}: {direct(address)}")
        print(f"proxied {address}: {proxied(f'http://{address}:{PORT}/')}")
    print(f"proxied metadata: {proxied('http://169.254.169.254/latest/meta-data/')}")
""")
    .replace("PRIVATE", repr(PRIVATE))
    .replace("LINK_LOCAL", repr(LINK_LOCAL))
    .replace("PORT", str(PORT))
)
"""Run as a setup command in the build: tries each address directly and through the proxy."""


def ip(*argv: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *argv], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The namespace and its listener; yields the file the listener's counts go to."""
    tag = f"{os.getpid() % 100000}"
    netns, outside, inside = f"baton-egress-{tag}", f"beo{tag}", f"bei{tag}"
    log = tmp_path_factory.mktemp("listener") / "connections"
    ip("netns", "add", netns)
    listener = None
    try:
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", netns)
        ip("addr", "add", "10.213.0.1/24", "dev", outside)
        ip("addr", "add", "169.254.213.1/24", "dev", outside)
        ip("link", "set", outside, "up")
        for address in (f"{PRIVATE}/24", f"{LINK_LOCAL}/24"):
            ip("addr", "add", address, "dev", inside, netns=netns)
        ip("link", "set", inside, "up", netns=netns)
        ip("link", "set", "lo", "up", netns=netns)
        ip("route", "add", "default", "via", "10.213.0.1", netns=netns)
        with log.open("w") as out:
            listener = subprocess.Popen(
                ["ip", "netns", "exec", netns, "python3", "-c", LISTENER, PRIVATE, LINK_LOCAL,
                 str(PORT)], stdout=out,
            )  # fmt: skip
        _wait_for_listener()
        yield log
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def _wait_for_listener() -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _get(PRIVATE) is not None:
            return
        time.sleep(0.1)
    raise AssertionError("the listener in the test's namespace did not start")


def _get(address: str) -> bytes | None:
    import socket

    try:
        with socket.create_connection((address, PORT), timeout=2) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return sock.recv(100)
    except OSError:
        return None


def connections(log: Path) -> int:
    counts = log.read_text().split()
    return int(counts[-1]) if counts else 0


def test_the_test_s_listeners_answer_this_host_and_a_container_on_the_default_bridge(
    listeners: Path, docker_client: docker.DockerClient
) -> None:
    for address in (PRIVATE, LINK_LOCAL):
        assert _get(address) is not None and b"listener-reached" in (_get(address) or b"")
    script = f"import urllib.request; print(urllib.request.urlopen('http://{PRIVATE}:{PORT}/', "
    script += "timeout=10).read())"
    output = docker_client.containers.run(
        "baton-sandbox:2", ["python3", "-c", script], network_mode="bridge", remove=True,
        labels={TEST_LABEL: "egress-control"},
    )  # fmt: skip
    assert b"listener-reached" in output  # where builds used to run, the LAN was in reach


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "runsc"])
def test_a_build_reaches_the_package_index_and_neither_a_private_nor_a_link_local_address(
    listeners: Path, docker_client: docker.DockerClient, tmp_path: Path, runtime: str | None
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "probe.py").write_text(PROBE)
    spec = EnvironmentSpec(
        setup=(
            "python3 probe.py",
            "python3 -m pip download --no-deps --dest /tmp/downloads six==1.16.0",
            # not `ls`: Debian's runsc answers its statx with EINVAL
            "python3 -c \"import os; print(os.listdir('/tmp/downloads'))\"",
        )
    )
    # The listener's address is even listed as a registry: the address rules refuse it anyway.
    settings = BuildSettings(
        runtime=runtime, egress_allow=(f"{PRIVATE}:{PORT}", f"{LINK_LOCAL}:{PORT}")
    )
    before = connections(listeners)
    tag = environment_tag(f"egress-test-{os.getpid()}-{runtime or 'runc'}")
    try:
        built = build_environment(
            spec, tree_tar(repo), tag=tag, settings=settings, labels={TEST_LABEL: "egress"},
            client=docker_client,
        )  # fmt: skip
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass

    log = built.log
    for address in (PRIVATE, LINK_LOCAL):
        assert re.search(rf"direct {address}: failed \w+", log), log
        proxied = re.search(rf"proxied {address}: (.*)", log)
        assert proxied is not None and proxied.group(1).startswith("refused 403"), log
    assert "private address" in log and "link-local" in log
    assert re.search(r"proxied metadata: refused 403 .*not a package registry", log), log
    assert "six-1.16.0-py2.py3-none-any.whl" in log  # the index was in reach
    assert connections(listeners) == before  # not one connection reached the listeners

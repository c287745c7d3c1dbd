"""The sandbox gate's rules, without dockerd: the requests Baton really sends pass and are
forwarded as sent, each rule refuses a body that breaks exactly that rule, and the two sockets
differ in exactly what builds may do.

Baton's sandbox bodies are captured, not written here: docker-py talks to a small recording
server on a unix socket, driven by the code that creates sandboxes. A change to Baton's sandbox
settings that the gate would refuse fails here. The build container's body is written here the
way `sandbox.build` writes it once builds reach the registries through the egress proxy (no
network, the egress folder and the CA bundle bound read-only)."""

from __future__ import annotations

import copy
import json
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import docker
import pytest
from click.testing import CliRunner

from sandbox.build import (
    BUILD_CAPABILITIES,
    CA_PATH,
    EGRESS_PATH,
    BuildSettings,
    _commit,
    _start_build_container,
)
from sandbox.config import SandboxConfig
from sandbox.docker import _create
from sandbox.environment import EnvironmentSpec
from sandbox.gate import rules
from sandbox.gate.cli import sandbox_gate
from sandbox.gate.errors import Refused
from sandbox.gate.lookup import Container
from sandbox.gate.policy import GatePolicy, touch_refusal
from sandbox.gate.routes import Refusal, Route, route, without_builds

CA_BUNDLE = "/etc/ssl/certs/host-ca.crt"
EGRESS = "/run/baton-egress-host"
CONTAINER_ID = "c0ffee" * 10 + "abcd"
POLICY = GatePolicy(
    networks=frozenset({"bridge"}), ca_bundle=CA_BUNDLE, egress_source=EGRESS, runtime="runsc"
)
SANDBOX = Container(CONTAINER_ID, {"baton.sandbox": "1"}, "1000:1000")
BUILD = Container(CONTAINER_ID, {"baton.sandbox": "1", "baton.build": "1"}, "0:0")


class Recorder(BaseHTTPRequestHandler):
    """Answers what docker-py asks when it creates, starts and commits, and records it."""

    protocol_version = "HTTP/1.1"
    server: Any

    def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        self.server.requests.append((self.command, self.path, json.loads(raw) if raw else None))

    def do_GET(self) -> None:
        self._record()
        self._answer(200, {"ApiVersion": "1.41", "Version": "20.10.24"})

    def do_POST(self) -> None:
        self._record()
        path = urlsplit(self.path).path
        if path.endswith("/containers/create"):
            self._answer(201, {"Id": CONTAINER_ID, "Warnings": []})
        elif path.endswith("/exec"):
            self._answer(201, {"Id": "e" * 64})
        elif path.endswith("/commit"):
            self._answer(201, {"Id": "sha256:" + "e" * 64})
        else:
            self._answer(204)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class RecordingServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, Recorder)
        self.requests: list[tuple[str, str, Any]] = []


Recorded = tuple[docker.DockerClient, list[tuple[str, str, Any]]]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    path = str(tmp_path_factory.mktemp("docker") / "docker.sock")
    server = RecordingServer(path)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    client = docker.DockerClient(base_url=f"unix://{path}", version="1.41")
    yield client, server.requests
    client.close()
    server.shutdown()
    server.server_close()


@pytest.fixture
def recorded(recording: Recorded) -> Recorded:
    """A docker-py client whose requests are recorded (method, path, JSON body), from none."""
    recording[1].clear()
    return recording


def created_bodies(requests: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    return [body for method, path, body in requests if path.startswith("/v1.41/containers/create")]


@pytest.fixture
def sandbox_body(recorded: Recorded) -> dict[str, Any]:
    """What `DockerSandbox.start` sends for the default settings, with a variable and run labels."""
    client, requests = recorded
    labels = {"baton.run": "r1", "baton.stage": "fix", "baton.attempt": "1"}
    _create(client, SandboxConfig(), labels, {"API_TOKEN": "never-logged"})
    return created_bodies(requests)[-1]


@pytest.fixture
def build_body(recorded: Recorded) -> dict[str, Any]:
    """A build container as `sandbox.build` makes it with the egress proxy: docker-py's own
    host config, no network, the CA bundle and the egress folder bound read-only."""
    client, requests = recorded
    host_config = client.api.create_host_config(
        network_mode="none", cap_drop=["ALL"], cap_add=BUILD_CAPABILITIES,
        security_opt=["no-new-privileges"], pids_limit=4096, mem_limit=4096 * 2**20,
        memswap_limit=4096 * 2**20, nano_cpus=2_000_000_000, init=True,
        binds={CA_BUNDLE: {"bind": CA_PATH, "mode": "ro"},
               EGRESS: {"bind": EGRESS_PATH, "mode": "ro"}},
    )  # fmt: skip
    client.api.create_container(
        "baton-sandbox:2", command=["sleep", "3600"], name="baton-build-0123", user="0:0",
        working_dir="/workspace", environment={"PATH": "/usr/bin:/bin"}, host_config=host_config,
        labels={"baton.build": "1", "baton.sandbox": "1", "baton.expires": "9", "baton.owner": "o"},
    )  # fmt: skip
    return created_bodies(requests)[-1]


STAMPED_OWNER = "gate-host/4026531836:4242:987654"
"""The owner `forwarded` has the gate stamp, as it would for the process on a socket."""


def forwarded(
    body: dict[str, Any], *, build_socket: bool = False, policy: GatePolicy = POLICY
) -> dict[str, Any]:
    """What the gate forwards for `body`."""
    raw = json.dumps(body).encode()
    result: dict[str, Any] = json.loads(
        rules.create(policy, raw, build_socket=build_socket, owner=STAMPED_OWNER)
    )
    return result


def refusal(
    body: dict[str, Any] | bytes, *, build_socket: bool = False, policy: GatePolicy = POLICY
) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(Refused) as refused:
        rules.create(policy, raw, build_socket=build_socket)
    return refused.value.reason


# -- what Baton sends passes, unchanged ---------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        SandboxConfig(),
        SandboxConfig(runtime="runsc", memory_mb=256, pids_limit=64, cpus=0.5),
        SandboxConfig(network="bridge"),
        SandboxConfig(image="baton-env:0123456789abcdef", ttl_s=60, user="1234:5678"),
        SandboxConfig(memory_mb=8192, cpus=4, pids_limit=4096, tmp_size_mb=4096, workspace_mb=4096),
    ],
    ids=["defaults", "runsc-small", "opted-in-network", "environment-image", "at-the-caps"],
)
@pytest.mark.parametrize("build_socket", [False, True], ids=["socket", "build-socket"])
def test_the_sandboxes_baton_creates_pass_as_sent(
    recorded: Recorded, cfg: SandboxConfig, build_socket: bool
) -> None:
    client, requests = recorded
    _create(client, cfg, {"baton.pool": "1"}, {"VAR": "value"}, seed=False)
    (body,) = created_bodies(requests)
    sent = copy.deepcopy(body)
    sent["HostConfig"]["Runtime"] = "runsc"  # the gate's, whatever was asked
    sent["Labels"]["baton.owner"] = STAMPED_OWNER  # the socket's peer, whatever was said
    assert sent["HostConfig"]["Mounts"][0].pop("Source") is None  # null: not forwarded
    assert forwarded(body, build_socket=build_socket) == sent


def test_the_build_container_passes_as_sent_through_the_build_socket_only(
    build_body: dict[str, Any],
) -> None:
    assert build_body["HostConfig"]["CapAdd"] and build_body["User"] == "0:0"
    sent = copy.deepcopy(build_body)
    sent["HostConfig"]["Runtime"] = "runsc"
    sent["Labels"]["baton.owner"] = STAMPED_OWNER
    assert forwarded(build_body, build_socket=True) == sent
    assert "only through the build socket" in refusal(build_body, build_socket=False)


@pytest.mark.parametrize("build_socket", [False, True], ids=["socket", "build-socket"])
def test_the_owner_a_caller_writes_is_replaced_by_the_one_the_gate_stamps(
    recorded: Recorded, build_body: dict[str, Any], build_socket: bool
) -> None:
    client, requests = recorded
    _create(client, SandboxConfig(), {"baton.owner": "forged-host/1:1:1"}, {})
    body = created_bodies(requests)[-1]
    chosen = build_body if build_socket else body
    chosen["Labels"]["baton.owner"] = "forged-host/1:1:1"
    assert forwarded(chosen, build_socket=build_socket)["Labels"]["baton.owner"] == STAMPED_OWNER
    raw = json.dumps(chosen).encode()
    unknown = json.loads(rules.create(POLICY, raw, build_socket=build_socket, owner=None))
    assert "baton.owner" not in unknown["Labels"]
    assert unknown["Labels"]["baton.sandbox"] == "1"  # the control: other labels are kept


def test_the_build_container_of_sandbox_build_passes_without_a_network(
    recorded: Recorded,
) -> None:
    client, requests = recorded
    settings = BuildSettings(ca_bundle=Path(CA_BUNDLE))
    _start_build_container(
        client, settings, EnvironmentSpec(), "/workspace", {}, EGRESS, "proxy.sock"
    )
    (body,) = created_bodies(requests)
    sent = forwarded(body, build_socket=True)["HostConfig"]
    assert sorted(sent["Binds"]) == sorted(
        [f"{CA_BUNDLE}:{CA_PATH}:ro", f"{EGRESS}:{EGRESS_PATH}:ro"]
    )
    assert sent["NetworkMode"] == "none" and sent["Runtime"] == "runsc"


def test_the_commit_baton_sends_goes_to_a_build_container_through_the_build_socket(
    recorded: Recorded,
) -> None:
    client, requests = recorded
    _commit(client, CONTAINER_ID, "baton-env:k1", EnvironmentSpec(), "/workspace",
            {"baton.build": "1", "baton.sandbox": "1"})  # fmt: skip
    ((method, target, body),) = [r for r in requests if "/commit" in r[1]]
    decided = route(POLICY, method, target, build_socket=True)
    assert isinstance(decided, Route) and decided.container == CONTAINER_ID
    assert decided.build_only and decided.body is not None
    assert parse_qs(urlsplit(decided.target("f" * 64)).query) == {
        "container": ["f" * 64], "repo": ["baton-env"], "tag": ["k1"], "pause": ["1"]
    }  # fmt: skip
    committed = json.loads(decided.body(json.dumps(body).encode(), BUILD))
    assert committed == {**body, "Labels": {**body["Labels"], "baton.sandbox": "",
                                            "baton.expires": "", "baton.owner": ""}}  # fmt: skip
    refused = route(POLICY, method, target, build_socket=False)
    assert isinstance(refused, Refusal) and "only the build socket" in refused.reason


def test_the_exec_baton_creates_is_forwarded_without_what_it_does_not_need(
    recorded: Recorded,
) -> None:
    client, requests = recorded
    client.api.exec_create(CONTAINER_ID, ["true"], stdin=True, user="1000:1000", workdir="/w",
                           environment={"A": "b"})  # fmt: skip
    ((method, target, body),) = [r for r in requests if r[1].endswith("/exec")]
    assert body["Privileged"] is False and body["Container"] == CONTAINER_ID
    decided = route(POLICY, method, target, build_socket=False)
    assert isinstance(decided, Route) and decided.body is not None
    assert json.loads(decided.body(json.dumps(body).encode(), SANDBOX)) == {
        "Cmd": ["true"], "Env": ["A=b"], "User": "1000:1000", "WorkingDir": "/w",
        "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Tty": False,
    }  # fmt: skip


# -- each rule refuses what breaks it ---------------------------------------------------------


def set_host(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["HostConfig"][key] = value

    return change


def drop_host(key: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        del body["HostConfig"][key]

    return change


WORKSPACE_VOLUME = {"/workspace": {}}
"""An anonymous volume at the workspace: the host's disk, unbounded."""


def both(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        for each in changes:
            each(body)

    return change


def workspace_o(options: str) -> Callable[[dict[str, Any]], None]:
    """Sets the tmpfs options (`o=`) of the workspace volume."""

    def change(body: dict[str, Any]) -> None:
        body["HostConfig"]["Mounts"][0]["VolumeOptions"]["DriverConfig"]["Options"]["o"] = options

    return change


def workspace_driver(name: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["HostConfig"]["Mounts"][0]["VolumeOptions"]["DriverConfig"]["Name"] = name

    return change


def workspace_target(path: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["HostConfig"]["Mounts"][0]["Target"] = path

    return change


def set_top(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body[key] = value

    return change


def set_label(key: str, value: str | None) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        if value is None:
            del body["Labels"][key]
        else:
            body["Labels"][key] = value

    return change


UNKNOWN = "is not one the gate forwards here"
NOT_INT = "Input should be a valid integer"
GIB = 2**30
SANDBOX_BREAKS = [
    ("privileged", set_host("Privileged", True), f"HostConfig: the key 'Privileged' {UNKNOWN}"),
    ("privileged-false", set_host("Privileged", False), f"'Privileged' {UNKNOWN}"),
    ("top-level-privileged", set_top("Privileged", True),
     f"the body: the key 'Privileged' {UNKNOWN}"),
    ("top-level-memory", set_top("Memory", GIB), f"the body: the key 'Memory' {UNKNOWN}"),
    ("top-level-cpuset", set_top("Cpuset", "0"), f"'Cpuset' {UNKNOWN}"),
    ("no-host-config", set_top("HostConfig", None), "it has no HostConfig"),
    ("cap-add", set_host("CapAdd", ["CHOWN"]), "HostConfig.CapAdd ['CHOWN']: a sandbox adds none"),
    ("cap-add-lower", set_host("CapAdd", ["cap_chown"]), "HostConfig.CapAdd ['CHOWN']"),
    ("cap-drop-not-all", set_host("CapDrop", ["NET_RAW"]), "HostConfig.CapDrop does not hold ALL"),
    ("no-cap-drop", drop_host("CapDrop"), "HostConfig.CapDrop does not hold ALL"),
    ("cap-not-ascii", set_host("CapDrop", ["\u0430ll"]), "not ASCII"),
    ("no-no-new-privileges", set_host("SecurityOpt", []), "lacks no-new-privileges"),
    ("nnp-undone", set_host("SecurityOpt", ["no-new-privileges", "no-new-privileges=false"]),
     "no-new-privileges=false"),
    ("seccomp-unconfined", set_host("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"]),
     "seccomp=unconfined"),
    ("apparmor-unconfined", set_host("SecurityOpt", ["no-new-privileges", "apparmor=unconfined"]),
     "apparmor=unconfined"),
    ("bind-root", set_host("Binds", ["/:/host"]), "HostConfig.Binds ['/:/host']"),
    ("ca-bundle-in-a-sandbox", set_host("Binds", [f"{CA_BUNDLE}:{CA_PATH}:ro"]),
     "HostConfig.Binds"),
    ("mounts-tmpfs", set_host("Mounts", [{"Type": "tmpfs", "Target": "/workspace"}]),
     "a sandbox's workspace is one volume"),
    ("mounts-bind", set_host("Mounts", [{"Type": "bind", "Source": "/", "Target": "/workspace"}]),
     "a sandbox's workspace is one volume"),
    ("workspace-missing", drop_host("Mounts"), "HostConfig.Mounts has 0 mounts"),
    ("workspace-anonymous-volume", both(drop_host("Mounts"), set_top("Volumes", WORKSPACE_VOLUME)),
     "never an anonymous volume"),
    ("workspace-no-size", workspace_o("uid=1000,gid=1000,nosuid,nodev"),
     "the workspace's size is none MB"),
    ("workspace-over-max", workspace_o("size=4097m,nosuid,nodev"),
     "the workspace's size is 4097 MB: between 1 and 4096 (--max-workspace-mb)"),
    ("workspace-in-gigabytes", workspace_o("size=1g,nosuid,nodev"), "a sandbox's workspace is"),
    ("workspace-suid", workspace_o("size=64m,nodev"), "a sandbox's workspace is"),
    ("workspace-other-driver", workspace_driver("nfs"), "a sandbox's workspace is"),
    ("workspace-elsewhere", workspace_target("/etc"), "a sandbox's workspace is"),
    ("volume-driver", set_host("VolumeDriver", "local-persist"), f"'VolumeDriver' {UNKNOWN}"),
    ("devices", set_host("Devices", []), f"'Devices' {UNKNOWN}"),
    ("pid-host", set_host("PidMode", "host"), f"'PidMode' {UNKNOWN}"),
    ("ipc-host", set_host("IpcMode", "host"), f"'IpcMode' {UNKNOWN}"),
    ("userns-host", set_host("UsernsMode", "host"), f"'UsernsMode' {UNKNOWN}"),
    ("group-add", set_host("GroupAdd", ["0"]), f"'GroupAdd' {UNKNOWN}"),
    ("port-bindings", set_host("PortBindings", {}), f"'PortBindings' {UNKNOWN}"),
    ("unknown-setting", set_host("NewDockerSetting", {"x": 1}), f"'NewDockerSetting' {UNKNOWN}"),
    ("network-host", set_host("NetworkMode", "host"), "HostConfig.NetworkMode 'host'"),
    ("network-not-allowed", set_host("NetworkMode", "internal"), "HostConfig.NetworkMode"),
    ("network-unset", drop_host("NetworkMode"), "HostConfig.NetworkMode ''"),
    ("network-none-upper", set_host("NetworkMode", "NONE"), "HostConfig.NetworkMode 'NONE'"),
    ("joins-networks", set_top("NetworkingConfig", {"EndpointsConfig": {}}), "EndpointsConfig"),
    ("no-memory-limit", drop_host("Memory"), "HostConfig.Memory 0"),
    ("memory-over-the-cap", set_host("Memory", 9 * GIB), "--max-memory-mb"),
    ("swap", set_host("MemorySwap", -1), "HostConfig.MemorySwap is not Memory"),
    ("no-cpu-limit", drop_host("NanoCpus"), "HostConfig.NanoCpus 0"),
    ("cpus-over-the-cap", set_host("NanoCpus", 5_000_000_000), "--max-cpus"),
    ("no-pids-limit", set_host("PidsLimit", 0), "HostConfig.PidsLimit 0"),
    ("unlimited-pids", set_host("PidsLimit", -1), "HostConfig.PidsLimit -1"),
    ("pids-over-the-cap", set_host("PidsLimit", 5000), "--max-pids"),
    ("memory-a-string", set_host("Memory", "1g"), f"HostConfig.Memory: {NOT_INT}"),
    ("memory-a-float", set_host("Memory", 1.0 * GIB), "fraction or an exponent"),
    ("pids-a-bool", set_host("PidsLimit", True), f"HostConfig.PidsLimit: {NOT_INT}"),
    ("writable-root", set_host("ReadonlyRootfs", False), "ReadonlyRootfs is not true"),
    ("root-unset", drop_host("ReadonlyRootfs"), "ReadonlyRootfs is not true"),
    ("root-a-string", set_host("ReadonlyRootfs", "true"), "Input should be a valid boolean"),
    ("log-shipped", set_host("LogConfig", {"Type": "syslog"}),
     "HostConfig.LogConfig.Type 'syslog'"),
    ("log-copies-env", set_host("LogConfig", {"Type": "json-file", "Config": {"env": "SECRET"}}),
     "HostConfig.LogConfig.Config ['env']"),
    ("tmpfs-suid", set_host("Tmpfs", {"/tmp": "rw,size=1m"}), "HostConfig.Tmpfs '/tmp': options"),
    ("tmpfs-odd-option", set_host("Tmpfs", {"/tmp": "rw,nosuid,nodev,uid=0"}), "options"),
    ("tmpfs-relative", set_host("Tmpfs", {"tmp": "rw,nosuid,nodev"}), "HostConfig.Tmpfs 'tmp'"),
    ("tmpfs-dotdot", set_host("Tmpfs", {"/tmp/../proc": "nosuid,nodev"}), "HostConfig.Tmpfs"),
    ("volume-elsewhere", set_top("Volumes", {"/etc": {}}), "Volumes ['/etc']"),
    ("runtime-asked", set_host("Runtime", "runc"), None),
    ("no-sandbox-label", set_label("baton.sandbox", None), "baton.sandbox=1"),
    ("build-label", set_label("baton.build", "1"), "only through the build socket"),
    ("build-label-other-value", set_label("baton.build", "true"),
     "the label baton.build is 'true'"),
    ("foreign-image", set_top("Image", "alpine:3"), "'alpine:3'"),
    ("image-named-like-ours", set_top("Image", "baton-sandboxes:2"), "'baton-sandboxes:2'"),
    ("image-by-digest", set_top("Image", "baton-sandbox:2@sha256:" + "a" * 64), "is not one of"),
    ("no-user", set_top("User", ""), "User '' is not uid:gid"),
    ("user-root", set_top("User", "0:0"), "User '0:0' is root"),
    ("user-root-padded", set_top("User", "00:1000"), "User '00:1000' is root"),
    ("group-root", set_top("User", "1000:0"), "User '1000:0' is root"),
    ("user-name", set_top("User", "root"), "User 'root' is not uid:gid"),
    ("user-alone", set_top("User", "1000"), "User '1000' is not uid:gid"),
    ("user-signed", set_top("User", "+0:1"), "User '+0:1' is not uid:gid"),
    ("user-wide-digits", set_top("User", "١٠٠٠:١٠٠٠"), "is not uid:gid"),
    ("user-out-of-range", set_top("User", "2147483648:1"), "out of range"),
    ("user-of-many-digits", set_top("User", "1" * 5000 + ":1"), "is not uid:gid"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"), [case[1:] for case in SANDBOX_BREAKS], ids=[c[0] for c in SANDBOX_BREAKS]
)
def test_a_sandbox_breaking_one_rule_is_refused_for_it(
    sandbox_body: dict[str, Any], change: Callable[[dict[str, Any]], None], named: str | None
) -> None:
    body = copy.deepcopy(sandbox_body)
    change(body)
    if named is None:  # neutralised instead
        assert forwarded(body)["HostConfig"]["Runtime"] == "runsc"
        return
    assert named in refusal(body)


BUILD_BREAKS = [
    ("cap-sys-admin", set_host("CapAdd", ["CHOWN", "SYS_ADMIN"]), "['SYS_ADMIN']"),
    ("cap-net-admin-spelled-cap", set_host("CapAdd", ["CAP_NET_ADMIN"]), "['NET_ADMIN']"),
    ("cap-all", set_host("CapAdd", ["ALL"]), "HostConfig.CapAdd ['ALL']"),
    ("privileged", set_host("Privileged", True), f"'Privileged' {UNKNOWN}"),
    ("bridge-network", set_host("NetworkMode", "bridge"), "HostConfig.NetworkMode 'bridge'"),
    ("other-ca-path", set_host("Binds", ["/etc/shadow:/run/baton-build/ca.crt:ro"]),
     "HostConfig.Binds ['/etc/shadow:/run/baton-build/ca.crt:ro']"),
    ("egress-writable", set_host("Binds", [f"{EGRESS}:{EGRESS_PATH}:rw"]), "HostConfig.Binds"),
    ("egress-elsewhere", set_host("Binds", [f"{EGRESS}:/etc:ro"]), "HostConfig.Binds"),
    ("docker-socket", set_host("Binds", ["/var/run/docker.sock:/run/baton-egress:ro"]),
     "HostConfig.Binds"),
    ("user-name", set_top("User", "root"), "User 'root' is not uid:gid"),
    ("no-nnp", set_host("SecurityOpt", []), "no-new-privileges"),
    ("no-pids-limit", drop_host("PidsLimit"), "HostConfig.PidsLimit 0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"), [case[1:] for case in BUILD_BREAKS], ids=[c[0] for c in BUILD_BREAKS]
)
def test_a_build_container_breaking_one_rule_is_refused_for_it(
    build_body: dict[str, Any], change: Callable[[dict[str, Any]], None], named: str
) -> None:
    body = copy.deepcopy(build_body)
    change(body)
    assert named in refusal(body, build_socket=True)


def test_a_build_container_may_run_as_root_with_a_writable_root(
    build_body: dict[str, Any],
) -> None:
    body = copy.deepcopy(build_body)
    body["HostConfig"]["ReadonlyRootfs"] = False
    assert forwarded(body, build_socket=True)["User"] == "0:0"


def test_binds_are_refused_when_the_gate_allows_none(build_body: dict[str, Any]) -> None:
    reason = refusal(build_body, build_socket=True, policy=GatePolicy(runtime="runsc"))
    assert "the host paths a build container may see are none" in reason


def test_the_egress_source_may_be_a_volume_name(build_body: dict[str, Any]) -> None:
    body = copy.deepcopy(build_body)
    body["HostConfig"]["Binds"] = [f"baton-egress:{EGRESS_PATH}:ro"]
    policy = GatePolicy(egress_source="baton-egress")
    assert forwarded(body, build_socket=True, policy=policy)["HostConfig"]["Binds"] == [
        f"baton-egress:{EGRESS_PATH}:ro"
    ]


@pytest.mark.parametrize(
    ("options", "wrong"),
    [
        ({"networks": frozenset({"host"})}, "--allow-network 'host'"),
        ({"networks": frozenset({"container:x"})}, "--allow-network 'container:x'"),
        ({"ca_bundle": "relative.crt"}, "--allow-ca-bundle"),
        ({"egress_source": "/a:/b"}, "--allow-egress-source"),
        ({"egress_source": "-x"}, "--allow-egress-source"),
    ],
)
def test_gate_options_that_would_open_too_much_are_refused(
    options: dict[str, Any], wrong: str
) -> None:
    with pytest.raises(ValueError, match=wrong):
        GatePolicy(**options)


def test_a_refusal_never_quotes_an_environment_value(sandbox_body: dict[str, Any]) -> None:
    for change in (set_host("Privileged", True), set_top("Env", ["API_TOKEN=never-logged", 1])):
        body = copy.deepcopy(sandbox_body)
        change(body)
        assert "never-logged" not in refusal(body)


def test_an_allowed_image_prefix_lets_another_image_in(sandbox_body: dict[str, Any]) -> None:
    body = {**sandbox_body, "Image": "registry.local/tools:1"}
    policy = POLICY.model_copy(update={"image_prefixes": ("registry.local/",)})
    assert forwarded(body, policy=policy)["Image"] == "registry.local/tools:1"


def test_the_caps_are_the_gate_s_options(sandbox_body: dict[str, Any]) -> None:
    policy = POLICY.model_copy(update={"max_memory_mb": 512, "max_cpus": 0.5, "max_pids": 100})
    assert "between 1 and 536870912 bytes" in refusal(sandbox_body, policy=policy)  # 1024 MB


# -- runtimes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("asked", [None, "runc", "kata", "runsc-uds"])
def test_the_gate_s_runtime_replaces_the_caller_s(
    sandbox_body: dict[str, Any], build_body: dict[str, Any], asked: str | None
) -> None:
    for body, build_socket in ((sandbox_body, False), (build_body, True)):
        body = copy.deepcopy(body)
        body["HostConfig"]["Runtime"] = asked
        assert forwarded(body, build_socket=build_socket)["HostConfig"]["Runtime"] == "runsc"


def test_builds_run_under_the_build_runtime_when_one_is_set(
    sandbox_body: dict[str, Any], build_body: dict[str, Any]
) -> None:
    policy = POLICY.model_copy(update={"build_runtime": "runsc-uds"})
    assert forwarded(build_body, build_socket=True, policy=policy)["HostConfig"]["Runtime"] == (
        "runsc-uds"
    )
    assert forwarded(sandbox_body, policy=policy)["HostConfig"]["Runtime"] == "runsc"


def test_without_a_gate_runtime_the_caller_may_not_name_one(sandbox_body: dict[str, Any]) -> None:
    policy = GatePolicy()
    assert "Runtime" not in forwarded(sandbox_body, policy=policy)["HostConfig"]
    body = copy.deepcopy(sandbox_body)
    body["HostConfig"]["Runtime"] = "runc"
    assert "started without --runtime" in refusal(body, policy=policy)


# -- execs ------------------------------------------------------------------------------------


def exec_forwarded(body: dict[str, Any], container: Container = SANDBOX) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    result: dict[str, Any] = json.loads(
        rules.exec_create(raw, container_user=container.user, in_build=container is BUILD)
    )
    return result


def exec_refusal(body: dict[str, Any] | bytes, container: Container = SANDBOX) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(Refused) as refused:
        rules.exec_create(raw, container_user=container.user, in_build=container is BUILD)
    return refused.value.reason


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"Cmd": ["sh"], "Privileged": True}, "Privileged is true"),
        (b'{"Cmd": ["sh"], "privileged": true}', "Privileged is true"),
        (b'{"Cmd": ["sh"], "PRIVILEGED": true}', "Privileged is true"),
        (b'{"Cmd": ["sh"], "Privileged": false, "privileged": true}', "name one setting"),
        (b'{"Cmd": ["sh"], "Privileged": 1}', "Privileged: Input should be a valid boolean"),
        (b'{"Cmd": ["sh"], "Privileged": "false"}', "Input should be a valid boolean"),
        ({"Cmd": ["sh"], "Detach": True}, "Detach and DetachKeys"),
        ({"Cmd": ["sh"], "DetachKeys": "ctrl-x"}, "Detach and DetachKeys"),
        ({"Cmd": []}, "Cmd is empty"),
        ({"Env": ["A=b"]}, "Cmd is empty"),
        ({"Cmd": ["sh"], "ConsoleSize": [24, 80]}, f"'ConsoleSize' {UNKNOWN}"),
        ({"Cmd": ["sh"], "Entrypoint": ["sh"]}, f"'Entrypoint' {UNKNOWN}"),
        ({"Cmd": "sh"}, "Cmd: Input should be a valid list"),
    ],
)
def test_an_exec_asking_more_than_baton_s_is_refused(
    body: dict[str, Any] | bytes, named: str
) -> None:
    assert named in exec_refusal(body)


@pytest.mark.parametrize(
    "user", ["0", "root", "0:0", "00:1000", "0:1000", "1000:0", "root:root", "+0:1", "-0:1",
             "1000", "nobody", " 1000:1000", "1000:1000 "],
)  # fmt: skip
def test_an_exec_in_a_sandbox_never_runs_as_root_or_by_name(user: str) -> None:
    assert "User" in exec_refusal({"Cmd": ["id"], "User": user})
    assert "User" in exec_refusal(json.dumps({"Cmd": ["id"], "uSeR": user}).encode())


def test_an_exec_without_a_user_runs_as_the_container_s_and_names_it() -> None:
    assert exec_forwarded({"Cmd": ["id"], "User": ""})["User"] == "1000:1000"
    root_box = Container(CONTAINER_ID, {"baton.sandbox": "1"}, "")
    assert "the container's User '' is not uid:gid" in exec_refusal({"Cmd": ["id"]}, root_box)


def test_an_exec_in_a_build_container_may_run_as_root() -> None:
    assert exec_forwarded({"Cmd": ["id"], "User": "0:0"}, BUILD)["User"] == "0:0"
    assert exec_forwarded({"Cmd": ["id"]}, BUILD)["User"] == "0:0"
    assert "is not uid:gid" in exec_refusal({"Cmd": ["id"], "User": "root"}, BUILD)


def test_an_exec_user_is_forwarded_in_its_canonical_spelling() -> None:
    assert exec_forwarded({"Cmd": ["id"], "User": "01000:001000"})["User"] == "1000:1000"


def test_empty_exec_settings_docker_py_sends_are_dropped() -> None:
    sent = {"Cmd": ["true"], "Privileged": False, "Detach": False, "DetachKeys": "",
            "Container": "anything", "Tty": False, "User": "1000:1000"}  # fmt: skip
    assert exec_forwarded(sent) == {"Cmd": ["true"], "Tty": False, "User": "1000:1000"}


def test_an_exec_start_is_rebuilt() -> None:
    assert rules.exec_start(b'{"detach": false, "TTY": false}') == b'{"Detach":false,"Tty":false}'
    with pytest.raises(Refused, match="name one setting"):
        rules.exec_start(b'{"Detach": true, "detach": false}')
    with pytest.raises(Refused, match="ConsoleSize"):
        rules.exec_start(b'{"Detach": false, "ConsoleSize": [1, 1]}')


# -- commits ----------------------------------------------------------------------------------

COMMIT = {"Env": ["HOME=/tmp"], "User": "1000:1000", "WorkingDir": "/workspace",
          "Cmd": ["sleep", "infinity"], "Labels": {"baton.env.key": "k1"}}  # fmt: skip


def test_a_commit_blanks_every_label_that_makes_a_sandbox_or_a_build() -> None:
    committed = json.loads(rules.commit(json.dumps(COMMIT).encode()))
    assert committed["Labels"] == {"baton.env.key": "k1", "baton.sandbox": "", "baton.build": "",
                                   "baton.expires": "", "baton.owner": ""}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"User": "0:0"}, "User '0:0' is root"),
        ({"User": "root"}, "not uid:gid"),
        ({"User": None}, "User '' is not uid:gid"),
        ({"Labels": {"baton.build": "1"}}, "Labels ['baton.build'] are set"),
        ({"Labels": {"baton.sandbox": "1", "baton.owner": "x"}},
         "['baton.owner', 'baton.sandbox']"),
        ({"Entrypoint": ["sh"]}, f"'Entrypoint' {UNKNOWN}"),
        ({"HostConfig": {}}, f"'HostConfig' {UNKNOWN}"),
        ({"Volumes": {"/etc": {}}}, f"'Volumes' {UNKNOWN}"),
        ({"ExposedPorts": {"22/tcp": {}}}, f"'ExposedPorts' {UNKNOWN}"),
    ],
)  # fmt: skip
def test_a_commit_asking_more_than_baton_s_is_refused(change: dict[str, Any], named: str) -> None:
    with pytest.raises(Refused) as refused:
        rules.commit(json.dumps({**COMMIT, **change}).encode())
    assert named in refused.value.reason


@pytest.mark.parametrize("raw", [b"", b'{"User": "1000:1000", "uSER": "0:0"}'])
def test_a_commit_without_a_body_or_spelled_twice_is_refused(raw: bytes) -> None:
    with pytest.raises(Refused):
        rules.commit(raw)


# -- which socket touches which container -----------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "socket_ok", "build_socket_ok", "commit_ok"),
    [
        ({"baton.sandbox": "1"}, True, True, False),
        ({"baton.sandbox": "1", "baton.build": "1"}, False, True, True),
        ({"baton.sandbox": "1", "baton.build": ""}, True, True, False),
        ({"baton.build": "1"}, False, False, False),
        ({"baton.sandbox": "0"}, False, False, False),
        ({"com.example": "1"}, False, False, False),
    ],
)
def test_a_container_s_labels_and_the_socket_decide_who_touches_it(
    labels: dict[str, str], socket_ok: bool, build_socket_ok: bool, commit_ok: bool
) -> None:
    assert (touch_refusal(labels, build_socket=False) is None) is socket_ok
    assert (touch_refusal(labels, build_socket=True) is None) is build_socket_ok
    assert (touch_refusal(labels, build_socket=True, build_only=True) is None) is commit_ok


def test_a_container_list_through_the_worker_socket_hides_build_containers() -> None:
    listed = [{"Id": "a", "Labels": {"baton.sandbox": "1"}},
              {"Id": "b", "Labels": {"baton.sandbox": "1", "baton.build": "1"}},
              {"Id": "c", "Labels": None}]  # fmt: skip
    assert [c["Id"] for c in json.loads(without_builds(json.dumps(listed).encode()))] == ["a", "c"]
    for build_socket in (False, True):
        decided = route(POLICY, "GET", "/v1.41/containers/json?all=1", build_socket=build_socket)
        assert isinstance(decided, Route) and decided.hides_builds is not build_socket


# -- routes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/_ping"),
        ("HEAD", "/_ping"),
        ("GET", "/version"),
        ("GET", "/v1.41/info"),
        ("GET", "/v1.45/info"),
        ("GET", "/v1.41/images/baton-sandbox:2/json"),
        ("GET", "/v1.41/images/docker.io/library/python:3.11/json"),
        ("DELETE", "/v1.41/images/baton-env:0123abcd?force=1&noprune=0"),
    ],
)
def test_plain_requests_are_forwarded_unchanged(method: str, target: str) -> None:
    decided = route(POLICY, method, target, build_socket=False)
    assert isinstance(decided, Route)
    assert decided.container is None and decided.exec_id is None and decided.body is None
    assert decided.target("") == target


@pytest.mark.parametrize(
    ("method", "target", "named"),
    [
        ("POST", "/v1.41/build?t=x", "not an API call"),
        ("POST", "/v1.41/images/create?fromImage=alpine&tag=3", "not an API call"),
        ("POST", "/v1.41/images/load", "not an API call"),
        ("GET", "/v1.41/images/json", "only one's inspection"),
        ("DELETE", "/v1.41/images/redis:7", "'redis:7' is not an environment image"),
        ("DELETE", "/v1.41/images/baton-sandbox:2", "not an environment image"),
        ("POST", "/v1.41/images/baton-env:k/tag?repo=redis&tag=7", "not an API call"),
        ("GET", "/v1.41/volumes", "not an API call"),
        ("POST", "/v1.41/networks/bridge/connect", "not an API call"),
        ("GET", "/v1.41/events", "not an API call"),
        ("POST", "/v1.41/containers/prune", "not an API call"),
        ("POST", "/v1.41/containers/abc/update", "not an API call"),
        ("POST", "/v1.41/containers/abc/attach?stream=1", "not an API call"),
        ("POST", "/v1.41/containers/abc/restart", "not an API call"),
        ("GET", "/v1.41/containers/abc/export", "not an API call"),
        ("post", "/v1.41/containers/create", "not an API call"),
        ("POST", "/v1.41/system/prune", "not an API call"),
    ],
)
def test_everything_else_is_refused_saying_why(method: str, target: str, named: str) -> None:
    for build_socket in (False, True):
        decided = route(POLICY, method, target, build_socket=build_socket)
        assert isinstance(decided, Refusal) and named in decided.reason


@pytest.mark.parametrize(
    "version", ["v1.23", "v1.24", "v1.40", "v1.39.9", "v01.41", "v1.041", "v1", "v1.41.0", "v.41"]
)
def test_an_api_version_older_than_the_gate_s_or_oddly_spelled_is_refused(version: str) -> None:
    """Below 1.24 a start's body replaces the container's HostConfig; below 1.40 IPC is
    shareable by default: the gate reads bodies as v1.41 does."""
    for target in (f"/{version}/containers/abc/start", f"/{version}/containers/create"):
        decided = route(POLICY, "POST", target, build_socket=True)
        assert isinstance(decided, Refusal) and "API version" in decided.reason


@pytest.mark.parametrize(
    "target",
    [
        "//containers/create",
        "/v1.41//containers/create",
        "/v1.41/containers/create/",
        "/v1.41/containers/./create",
        "/v1.41/containers/abc/../create",
        "/v1.41/containers/a%2F..%2Fb/start",
        "http://docker/v1.41/containers/create",
        "/v1.41/containers/create#x",
    ],
)
def test_a_path_that_is_not_plain_is_refused(target: str) -> None:
    decided = route(POLICY, "POST", target, build_socket=False)
    assert isinstance(decided, Refusal)


@pytest.mark.parametrize(
    ("method", "target", "named"),
    [
        ("POST", "/v1.41/containers/abc/start?checkpoint=c1", "'checkpoint'"),
        ("POST", "/v1.41/containers/abc/start?checkpoint-dir=/", "'checkpoint-dir'"),
        ("POST", "/v1.41/containers/create?name=a&name=b", "'name' is given twice"),
        ("POST", "/v1.41/containers/create?platform=linux", "'platform'"),
        ("POST", "/v1.41/containers/create?name=../x", "is not a container name"),
        ("DELETE", "/v1.41/containers/abc?link=1", "only false is accepted"),
        ("POST", "/v1.41/containers/abc/kill?signal=KILL&signal=HUP", "given twice"),
        ("POST", "/v1.41/containers/abc/stop?t=1.5", "is not an integer"),
        ("POST", "/v1.41/containers/abc/stop?t=+5", "' 5' is not an integer"),
        ("POST", "/v1.41/commit?container=a&repo=baton-env&tag=k&changes=USER%200",
         "'changes'"),
        ("POST", "/v1.41/commit?container=a&repo=baton-env&repo=redis&tag=k", "given twice"),
        ("POST", "/v1.41/commit?container=a&repo=redis&tag=7", "'redis:7'"),
        ("POST", "/v1.41/commit?repo=baton-env&tag=k", "names no container"),
        ("GET", "/v1.41/containers/abc/logs?stdout=1&tail=all;x", "all or a number"),
        ("GET", "/v1.41/containers/json?filters=%7Bx", "not Docker's JSON"),
        ("GET", "/v1.41/containers/json?filters=%7B%22label%22%3A5%7D", "not Docker's JSON"),
    ],
)  # fmt: skip
def test_query_parameters_outside_a_route_s_allowlist_are_refused(
    method: str, target: str, named: str
) -> None:
    decided = route(POLICY, method, target, build_socket=True)
    assert isinstance(decided, Refusal) and named in decided.reason


@pytest.mark.parametrize(
    ("method", "ref", "rest", "forwarded_rest"),
    [
        ("POST", "baton-sbx-r1.fix.1-0a1b", "/start", "/start"),
        ("GET", "abc", "/json", "/json"),
        ("DELETE", "abc", "?v=True&link=False&force=True", "?v=1&force=1"),
        ("POST", "abc", "/wait?condition=removed", "/wait?condition=removed"),
        ("POST", "abc", "/rename?name=baton-sbx-x", "/rename?name=baton-sbx-x"),
        ("GET", "abc", "/archive?path=%2Fworkspace%2Fa%20b", "/archive?path=%2Fworkspace%2Fa+b"),
        ("HEAD", "abc", "/archive?path=%2Fw", "/archive?path=%2Fw"),
        ("PUT", "abc", "/archive?path=%2Fw&copyUIDGID=yes", "/archive?path=%2Fw&copyUIDGID=1"),
        ("POST", "abc", "/exec", "/exec"),
        ("POST", "abc", "/kill?signal=KILL", "/kill?signal=KILL"),
        ("POST", "abc", "/stop?t=%2B05", "/stop?t=5"),
        ("GET", "abc", "/logs?stdout=1&stderr=1&timestamps=0&follow=0&tail=all",
         "/logs?stdout=1&stderr=1&timestamps=0&follow=0&tail=all"),
    ],
)  # fmt: skip
def test_a_request_on_a_container_goes_to_the_container_the_gate_checked(
    method: str, ref: str, rest: str, forwarded_rest: str
) -> None:
    decided = route(POLICY, method, f"/v1.41/containers/{ref}{rest}", build_socket=False)
    assert isinstance(decided, Route)
    assert decided.container == ref and not decided.build_only
    assert decided.target(CONTAINER_ID) == f"/v1.41/containers/{CONTAINER_ID}{forwarded_rest}"


@pytest.mark.parametrize(
    ("method", "rest"),
    [("POST", "/start"), ("POST", "/kill"), ("POST", "/stop"), ("POST", "/wait"),
     ("POST", "/rename?name=x"), ("DELETE", ""), ("GET", "/json"), ("GET", "/logs?stdout=1"),
     ("GET", "/archive?path=%2Fw"), ("HEAD", "/archive?path=%2Fw")],
)  # fmt: skip
def test_requests_that_take_no_body_are_routed_to_refuse_one(method: str, rest: str) -> None:
    decided = route(POLICY, method, f"/v1.41/containers/abc{rest}", build_socket=True)
    assert isinstance(decided, Route) and decided.body is None and not decided.streamed


def test_only_an_archive_upload_streams_its_body() -> None:
    decided = route(POLICY, "PUT", "/v1.41/containers/abc/archive?path=%2Fw", build_socket=False)
    assert isinstance(decided, Route) and decided.streamed
    assert decided.content_type == "application/x-tar"


def test_a_request_without_an_api_version_keeps_none() -> None:
    decided = route(POLICY, "POST", "/containers/abc/stop", build_socket=False)
    assert isinstance(decided, Route)
    assert decided.target(CONTAINER_ID) == f"/containers/{CONTAINER_ID}/stop"


@pytest.mark.parametrize(
    ("method", "target"),
    [("GET", "/v1.41/exec/e1/json"), ("POST", "/v1.41/exec/e1/start"),
     ("POST", "/v1.41/exec/e1/resize?h=24&w=80")],
)  # fmt: skip
def test_a_request_on_an_exec_is_checked_by_its_container(method: str, target: str) -> None:
    decided = route(POLICY, method, target, build_socket=False)
    assert isinstance(decided, Route)
    assert decided.exec_id == "e1" and decided.container is None
    assert decided.target(CONTAINER_ID) == target
    assert (decided.body is not None) is target.endswith("/start")


@pytest.mark.parametrize(
    ("query", "labels"),
    [
        ("all=1", ["baton.sandbox=1"]),
        ("filters=" + json.dumps({"label": ["baton.run=r1"]}), ["baton.run=r1", "baton.sandbox=1"]),
        ("filters=" + json.dumps({"label": {"a=1": True, "b=2": False}, "name": ["x"]}),
         ["a=1", "baton.sandbox=1"]),
    ],
)  # fmt: skip
def test_listing_containers_sees_only_sandboxes(query: str, labels: list[str]) -> None:
    decided = route(POLICY, "GET", f"/v1.41/containers/json?{query}", build_socket=False)
    assert isinstance(decided, Route)
    forwarded_query = parse_qs(urlsplit(decided.target("")).query)
    assert json.loads(forwarded_query["filters"][0])["label"] == labels


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--allow-network", "host"], "--allow-network 'host'"),
        (["--allow-egress-source", "/a:/b"], "--allow-egress-source"),
        (["--max-connections", "0"], "max_connections"),
        (["--request-timeout-s", "0"], "request_timeout_s"),
    ],
)
def test_the_command_refuses_options_that_would_open_too_much_before_listening(
    tmp_path: Path, options: list[str], named: str
) -> None:
    listen = tmp_path / "docker.sock"
    result = CliRunner().invoke(sandbox_gate, ["--listen", str(listen), *options])
    assert result.exit_code == 2 and named in result.output
    assert not listen.exists()

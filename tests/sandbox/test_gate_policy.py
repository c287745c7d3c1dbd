"""The sandbox gate's rules, without dockerd: the requests Baton really sends pass, and each
refusal rule refuses a body that breaks exactly that rule.

Baton's own bodies are captured, not written here: docker-py talks to a small recording server
on a unix socket, driven by the code that creates sandboxes and build containers and commits
environments. A change to Baton's container settings that the gate would refuse fails here."""

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

from sandbox.build import BuildSettings, _commit, _start_build_container
from sandbox.config import SandboxConfig
from sandbox.docker import _create
from sandbox.environment import EnvironmentSpec
from sandbox.gate.policy import (
    GatePolicy,
    create_refusal,
    exec_refusal,
    not_a_build,
    not_a_sandbox,
    with_runtime,
)
from sandbox.gate.routes import Refusal, Route, route

CA_BUNDLE = "/etc/ssl/certs/host-ca.crt"
CONTAINER_ID = "c0ffee" * 10 + "abcd"
POLICY = GatePolicy(networks=frozenset({"bridge"}), ca_bundle=CA_BUNDLE)


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
        self._answer(200, {"ApiVersion": "1.45", "Version": "28.0.0"})

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


@pytest.fixture(scope="module")
def recording(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[docker.DockerClient, list[tuple[str, str, Any]]]]:
    path = str(tmp_path_factory.mktemp("docker") / "docker.sock")
    server = RecordingServer(path)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    client = docker.DockerClient(base_url=f"unix://{path}", version="1.45")
    yield client, server.requests
    client.close()
    server.shutdown()
    server.server_close()


@pytest.fixture
def recorded(
    recording: tuple[docker.DockerClient, list[tuple[str, str, Any]]],
) -> tuple[docker.DockerClient, list[tuple[str, str, Any]]]:
    """A docker-py client whose requests are recorded (method, path, JSON body), from none."""
    recording[1].clear()
    return recording


def created_bodies(requests: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    return [body for method, path, body in requests if path.startswith("/v1.45/containers/create")]


@pytest.fixture
def sandbox_body(recorded: tuple[docker.DockerClient, list[Any]]) -> dict[str, Any]:
    """What `DockerSandbox.start` sends for the default settings, with a variable and run labels."""
    client, requests = recorded
    labels = {"baton.run": "r1", "baton.stage": "fix", "baton.attempt": "1"}
    _create(client, SandboxConfig(), labels, {"API_TOKEN": "never-logged"})
    (body,) = created_bodies(requests)
    return body


@pytest.fixture
def build_body(recorded: tuple[docker.DockerClient, list[Any]]) -> dict[str, Any]:
    """What `build_environment` sends for its build container, with a CA bundle."""
    client, requests = recorded
    settings = BuildSettings(ca_bundle=Path(CA_BUNDLE))
    _start_build_container(client, settings, EnvironmentSpec(), "/workspace", {})
    (body,) = created_bodies(requests)
    return body


# -- what Baton sends passes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        SandboxConfig(),
        SandboxConfig(runtime="runsc", memory_mb=256, pids_limit=64, cpus=0.5),
        SandboxConfig(network="bridge"),
        SandboxConfig(image="baton-env:0123456789abcdef", ttl_s=60),
    ],
    ids=["defaults", "runsc-small", "opted-in-network", "environment-image"],
)
def test_the_sandboxes_baton_creates_pass(
    recorded: tuple[docker.DockerClient, list[Any]], cfg: SandboxConfig
) -> None:
    client, requests = recorded
    _create(client, cfg, {"baton.pool": "1"}, {"VAR": "value"})
    (body,) = created_bodies(requests)
    assert create_refusal(POLICY, body) is None
    assert isinstance(route(POLICY, "POST", "/v1.45/containers/create?name=x"), Route)


def test_the_build_container_baton_creates_passes(build_body: dict[str, Any]) -> None:
    assert build_body["HostConfig"]["CapAdd"]  # the one container that adds capabilities
    assert create_refusal(POLICY, build_body) is None


def test_the_build_container_without_a_ca_bundle_passes(
    recorded: tuple[docker.DockerClient, list[Any]],
) -> None:
    client, requests = recorded
    _start_build_container(client, BuildSettings(ca_bundle=None), EnvironmentSpec(), "/w", {})
    (body,) = created_bodies(requests)
    assert create_refusal(GatePolicy(networks=frozenset({"bridge"})), body) is None


def test_the_commit_baton_sends_is_routed_to_a_build_container(
    recorded: tuple[docker.DockerClient, list[Any]],
) -> None:
    client, requests = recorded
    _commit(client, CONTAINER_ID, "baton-env:k1", EnvironmentSpec(), "/workspace", {})
    ((method, target, _),) = [r for r in requests if "/commit" in r[1]]
    decided = route(POLICY, method, target)
    assert isinstance(decided, Route)
    assert decided.container == CONTAINER_ID
    assert decided.label_rules == (not_a_sandbox, not_a_build)
    assert parse_qs(urlsplit(decided.target("f" * 64)).query)["container"] == ["f" * 64]


def test_the_exec_baton_creates_passes(
    recorded: tuple[docker.DockerClient, list[Any]],
) -> None:
    client, requests = recorded
    client.api.exec_create(CONTAINER_ID, ["true"], stdin=True, user="1000:1000", workdir="/w",
                           environment={"A": "b"})  # fmt: skip
    ((method, target, body),) = [r for r in requests if r[1].endswith("/exec")]
    decided = route(POLICY, method, target)
    assert isinstance(decided, Route) and decided.body_rule is not None
    assert decided.body_rule(body) is None


# -- each rule refuses what breaks it ---------------------------------------------------------


def set_host(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["HostConfig"][key] = value

    return change


def drop_host(key: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        del body["HostConfig"][key]

    return change


def set_top(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body[key] = value

    return change


def drop_sandbox_label(body: dict[str, Any]) -> None:
    del body["Labels"]["baton.sandbox"]


SANDBOX_BREAKS = [
    ("privileged", set_host("Privileged", True), "HostConfig.Privileged"),
    ("cap-add", set_host("CapAdd", ["CHOWN"]), "only a build container adds"),
    ("cap-drop-not-all", set_host("CapDrop", ["NET_RAW"]), "HostConfig.CapDrop"),
    ("no-cap-drop", drop_host("CapDrop"), "HostConfig.CapDrop"),
    ("no-no-new-privileges", set_host("SecurityOpt", []), "no-new-privileges"),
    ("seccomp-unconfined", set_host("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"]),
     "seccomp=unconfined"),
    ("apparmor-unconfined", set_host("SecurityOpt", ["no-new-privileges", "apparmor=unconfined"]),
     "apparmor=unconfined"),
    ("label-disable", set_host("SecurityOpt", ["no-new-privileges", "label=disable"]),
     "label=disable"),
    ("bind-root", set_host("Binds", ["/:/host"]), "HostConfig.Binds"),
    ("ca-bundle-writable", set_host("Binds", [f"{CA_BUNDLE}:/run/baton-build/ca.crt:rw"]),
     "HostConfig.Binds"),
    ("bind-mount", set_host("Mounts", [{"Type": "bind", "Source": "/", "Target": "/h"}]),
     "HostConfig.Mounts"),
    ("volume-mount", set_host("Mounts", [{"Type": "volume", "Source": "v", "Target": "/v"}]),
     "HostConfig.Mounts"),
    ("volume-driver", set_host("VolumeDriver", "local-persist"), "HostConfig.VolumeDriver"),
    ("devices", set_host("Devices", [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda"}]),
     "HostConfig.Devices"),
    ("device-requests", set_host("DeviceRequests", [{"Count": -1}]), "HostConfig.DeviceRequests"),
    ("pid-host", set_host("PidMode", "host"), "HostConfig.PidMode"),
    ("ipc-host", set_host("IpcMode", "host"), "HostConfig.IpcMode"),
    ("uts-host", set_host("UTSMode", "host"), "HostConfig.UTSMode"),
    ("userns-host", set_host("UsernsMode", "host"), "HostConfig.UsernsMode"),
    ("pid-of-a-container", set_host("PidMode", "container:abc"), "HostConfig.PidMode"),
    ("cgroup-parent", set_host("CgroupParent", "/"), "HostConfig.CgroupParent"),
    ("volumes-from", set_host("VolumesFrom", ["other"]), "HostConfig.VolumesFrom"),
    ("links", set_host("Links", ["other:db"]), "HostConfig.Links"),
    ("port-bindings", set_host("PortBindings", {"22/tcp": [{"HostPort": "2222"}]}),
     "HostConfig.PortBindings"),
    ("publish-all", set_host("PublishAllPorts", True), "HostConfig.PublishAllPorts"),
    ("sysctls", set_host("Sysctls", {"net.ipv4.ip_forward": "1"}), "HostConfig.Sysctls"),
    ("extra-hosts", set_host("ExtraHosts", ["metadata:169.254.169.254"]), "HostConfig.ExtraHosts"),
    ("masked-paths", set_host("MaskedPaths", []), "HostConfig.MaskedPaths"),
    ("network-host", set_host("NetworkMode", "host"), "HostConfig.NetworkMode 'host'"),
    ("network-not-allowed", set_host("NetworkMode", "internal"), "HostConfig.NetworkMode"),
    ("network-default", drop_host("NetworkMode"), "HostConfig.NetworkMode 'default'"),
    ("network-of-a-container", set_host("NetworkMode", "container:abc"), "HostConfig.NetworkMode"),
    ("joins-another-network", set_top("NetworkingConfig", {"EndpointsConfig": {"host": {}}}),
     "NetworkingConfig"),
    ("no-memory-limit", drop_host("Memory"), "HostConfig.Memory"),
    ("no-pids-limit", set_host("PidsLimit", 0), "HostConfig.PidsLimit"),
    ("log-shipped", set_host("LogConfig", {"Type": "syslog", "Config": {}}),
     "HostConfig.LogConfig.Type"),
    ("unknown-setting", set_host("NewDockerSetting", {"x": 1}), "NewDockerSetting"),
    ("no-sandbox-label", drop_sandbox_label, "baton.sandbox=1"),
    ("foreign-image", set_top("Image", "alpine:3"), "'alpine:3'"),
    ("image-named-like-ours", set_top("Image", "baton-sandboxes:2"), "'baton-sandboxes:2'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"), [case[1:] for case in SANDBOX_BREAKS], ids=[c[0] for c in SANDBOX_BREAKS]
)
def test_a_sandbox_breaking_one_rule_is_refused_for_it(
    sandbox_body: dict[str, Any], change: Callable[[dict[str, Any]], None], named: str
) -> None:
    body = copy.deepcopy(sandbox_body)
    change(body)
    reason = create_refusal(POLICY, body)
    assert reason is not None and named in reason


BUILD_BREAKS = [
    ("cap-sys-admin", set_host("CapAdd", ["CHOWN", "SYS_ADMIN"]), "['SYS_ADMIN']"),
    ("cap-net-admin-spelled-cap", set_host("CapAdd", ["CAP_NET_ADMIN"]), "['NET_ADMIN']"),
    ("privileged", set_host("Privileged", True), "HostConfig.Privileged"),
    ("other-ca-path", set_host("Binds", ["/etc/shadow:/run/baton-build/ca.crt:ro"]),
     "HostConfig.Binds"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"), [case[1:] for case in BUILD_BREAKS], ids=[c[0] for c in BUILD_BREAKS]
)
def test_a_build_container_breaking_one_rule_is_refused_for_it(
    build_body: dict[str, Any], change: Callable[[dict[str, Any]], None], named: str
) -> None:
    body = copy.deepcopy(build_body)
    change(body)
    reason = create_refusal(POLICY, body)
    assert reason is not None and named in reason


def test_the_ca_bundle_is_refused_when_the_gate_allows_none(build_body: dict[str, Any]) -> None:
    reason = create_refusal(GatePolicy(networks=frozenset({"bridge"})), build_body)
    assert reason is not None and "HostConfig.Binds" in reason


def test_the_build_network_is_refused_unless_allowed(build_body: dict[str, Any]) -> None:
    reason = create_refusal(GatePolicy(ca_bundle=CA_BUNDLE), build_body)
    assert reason is not None and "'bridge'" in reason


def test_a_refusal_never_quotes_an_environment_value(sandbox_body: dict[str, Any]) -> None:
    body = copy.deepcopy(sandbox_body)
    body["HostConfig"]["Privileged"] = True
    assert "never-logged" not in str(create_refusal(POLICY, body))


def test_an_allowed_image_prefix_lets_another_image_in(sandbox_body: dict[str, Any]) -> None:
    body = {**sandbox_body, "Image": "registry.local/tools:1"}
    assert create_refusal(POLICY.model_copy(update={"image_prefixes": ("registry.local/",)}),
                          body) is None  # fmt: skip


@pytest.mark.parametrize("asked", [None, "runc", "kata"])
def test_the_gate_s_runtime_replaces_the_caller_s(
    sandbox_body: dict[str, Any], asked: str | None
) -> None:
    body = copy.deepcopy(sandbox_body)
    body["HostConfig"]["Runtime"] = asked
    forced = with_runtime(GatePolicy(runtime="runsc"), body)
    assert forced["HostConfig"]["Runtime"] == "runsc"
    assert with_runtime(GatePolicy(), body)["HostConfig"]["Runtime"] == asked


def test_a_build_container_keeps_dockerd_s_default_runtime(build_body: dict[str, Any]) -> None:
    """Builds need the network runsc is registered without; they run no model's commands."""
    assert with_runtime(GatePolicy(runtime="runsc"), build_body) == build_body


def test_an_exec_asking_for_privileges_is_refused() -> None:
    reason = exec_refusal(POLICY, {"Cmd": ["sh"], "Privileged": True})
    assert reason is not None and "Privileged" in reason


@pytest.mark.parametrize(
    ("labels", "sandbox_ok", "build_ok"),
    [
        ({"baton.sandbox": "1"}, True, False),
        ({"baton.sandbox": "1", "baton.build": "1"}, True, True),
        ({"baton.sandbox": "0"}, False, False),
        ({"com.example": "1"}, False, False),
    ],
)
def test_container_labels_decide_what_may_touch_a_container(
    labels: dict[str, str], sandbox_ok: bool, build_ok: bool
) -> None:
    assert (not_a_sandbox(labels) is None) is sandbox_ok
    assert (not_a_build(labels) is None) is build_ok


# -- routes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/_ping"),
        ("HEAD", "/_ping"),
        ("GET", "/version"),
        ("GET", "/v1.45/info"),
        ("GET", "/v1.45/images/baton-sandbox:2/json"),
        ("GET", "/v1.45/images/docker.io/library/python:3.11/json"),
        ("DELETE", "/v1.45/images/baton-env:0123abcd?force=True&noprune=False"),
    ],
)
def test_plain_requests_are_forwarded_unchanged(method: str, target: str) -> None:
    decided = route(POLICY, method, target)
    assert isinstance(decided, Route)
    assert decided.container is None and decided.exec_id is None
    assert decided.target("") == target


@pytest.mark.parametrize(
    ("method", "target", "named"),
    [
        ("POST", "/v1.45/build?t=x", "not an API call"),
        ("POST", "/v1.45/images/create?fromImage=alpine&tag=3", "not an API call"),
        ("POST", "/v1.45/images/load", "not an API call"),
        ("GET", "/v1.45/images/json", "only one's inspection"),
        ("DELETE", "/v1.45/images/redis:7", "'redis:7' is not an environment image"),
        ("DELETE", "/v1.45/images/baton-sandbox:2", "not an environment image"),
        ("POST", "/v1.45/images/baton-env:k/tag?repo=redis&tag=7", "not an API call"),
        ("POST", "/v1.45/commit?container=abc&repo=redis&tag=7", "'redis:7'"),
        ("POST", "/v1.45/commit?repo=baton-env&tag=k", "names no container"),
        ("GET", "/v1.45/volumes", "not an API call"),
        ("POST", "/v1.45/volumes/create", "not an API call"),
        ("POST", "/v1.45/networks/create", "not an API call"),
        ("POST", "/v1.45/networks/bridge/connect", "not an API call"),
        ("GET", "/v1.45/plugins", "not an API call"),
        ("POST", "/v1.45/swarm/init", "not an API call"),
        ("GET", "/v1.45/secrets", "not an API call"),
        ("GET", "/v1.45/events", "not an API call"),
        ("POST", "/v1.45/containers/prune", "not an API call"),
        ("POST", "/v1.45/containers/abc/update", "not an API call"),
        ("POST", "/v1.45/containers/abc/attach?stream=1", "not an API call"),
        ("POST", "/v1.45/system/prune", "not an API call"),
        ("GET", "/v1.45/system/df", "not an API call"),
    ],
)
def test_everything_else_is_refused_saying_why(method: str, target: str, named: str) -> None:
    decided = route(POLICY, method, target)
    assert isinstance(decided, Refusal)
    assert named in decided.reason


@pytest.mark.parametrize(
    ("method", "ref", "rest"),
    [
        ("POST", "baton-sbx-r1.fix.1-0a1b", "/start"),
        ("GET", "abc", "/json"),
        ("DELETE", "abc", "?v=True&force=True"),
        ("POST", "abc", "/wait?condition=removed"),
        ("POST", "abc", "/rename?name=baton-sbx-x"),
        ("GET", "abc", "/archive?path=%2Fworkspace%2Fa%20b"),
        ("HEAD", "abc", "/archive?path=%2Fw"),
        ("PUT", "abc", "/archive?path=%2Fw"),
        ("POST", "abc", "/exec"),
        ("POST", "abc", "/kill?signal=KILL"),
        ("POST", "abc", "/stop"),
    ],
)
def test_a_request_on_a_container_goes_to_the_container_the_gate_checked(
    method: str, ref: str, rest: str
) -> None:
    decided = route(POLICY, method, f"/v1.45/containers/{ref}{rest}")
    assert isinstance(decided, Route)
    assert decided.container == ref
    assert decided.label_rules == (not_a_sandbox,)
    assert decided.target(CONTAINER_ID) == f"/v1.45/containers/{CONTAINER_ID}{rest}"


def test_a_request_without_an_api_version_keeps_none() -> None:
    decided = route(POLICY, "POST", "/containers/abc/stop")
    assert isinstance(decided, Route)
    assert decided.target(CONTAINER_ID) == f"/containers/{CONTAINER_ID}/stop"


@pytest.mark.parametrize(
    ("method", "target"),
    [("GET", "/v1.45/exec/e1/json"), ("POST", "/v1.45/exec/e1/start"),
     ("POST", "/v1.45/exec/e1/resize?h=24&w=80")],
)  # fmt: skip
def test_a_request_on_an_exec_is_checked_by_its_container(method: str, target: str) -> None:
    decided = route(POLICY, method, target)
    assert isinstance(decided, Route)
    assert decided.exec_id == "e1" and decided.container is None
    assert decided.target(CONTAINER_ID) == target


@pytest.mark.parametrize(
    ("query", "labels"),
    [
        ("all=1", ["baton.sandbox=1"]),
        ("filters=" + json.dumps({"label": ["baton.run=r1"]}), ["baton.run=r1", "baton.sandbox=1"]),
        ("filters=" + json.dumps({"label": {"a=1": True}, "name": ["x"]}),
         ["a=1", "baton.sandbox=1"]),
    ],
)  # fmt: skip
def test_listing_containers_sees_only_sandboxes(query: str, labels: list[str]) -> None:
    decided = route(POLICY, "GET", f"/v1.45/containers/json?{query}")
    assert isinstance(decided, Route)
    forwarded = parse_qs(urlsplit(decided.target("")).query)
    assert json.loads(forwarded["filters"][0])["label"] == labels


def test_listing_with_filters_that_are_not_json_is_refused() -> None:
    assert isinstance(route(POLICY, "GET", "/v1.45/containers/json?filters=%7Bx"), Refusal)

"""Spelled any way dockerd reads it, a setting still cannot get past the gate.

dockerd (Go 1.19's encoding/json) reads `privileged`, `PRIVILEGED` and `Privileged` as one key,
`ſ` as `s` and `K` as `k`, the last of two keys, a second `hostconfig` object merged into the
first, and host settings at the top level of a create body (a deprecated embedded HostConfig).
The controls send such variants straight to dockerd and show that it honours them (a
privileged container, a root exec, a replaced HostConfig: created, never started, removed at
once), so that a gate letting one through would be caught. The property tests then send
generated variants of every sensitive key, at every place it can sit, through a real gate:
each one is refused, or forwarded neutralised, and what dockerd created is inspected.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sandbox.conftest import DOCKERD, TEST_LABEL, Gate, docker_request, started_gate

EXAMPLES_PER_KEY = 30
"""Generated variants sent through the gate for each sensitive key (the same in every tier:
refusals are answered in about a millisecond)."""
CONTROL_EXAMPLES = 8
"""Generated variants also sent straight to dockerd, to show it honours them."""
GATE_RUNTIME = "runsc"
MIB = 2**20

SENSITIVE: dict[str, tuple[Any, Any]] = {
    "Privileged": (True, False),
    "Binds": (["/:/host"], []),
    "Mounts": ([{"Type": "bind", "Source": "/", "Target": "/host"}], []),
    "CapAdd": (["SYS_ADMIN"], []),
    "SecurityOpt": (["seccomp=unconfined"], ["no-new-privileges"]),
    "NetworkMode": ("host", "none"),
    "PidMode": ("host", ""),
    "IpcMode": ("host", "private"),
    "UsernsMode": ("host", ""),
    "Devices": (
        [{"PathOnHost": "/dev/kmsg", "PathInContainer": "/dev/kmsg", "CgroupPermissions": "rwm"}],
        [],
    ),
    "Runtime": ("runc", GATE_RUNTIME),
}
"""Each HostConfig key that would reach past the container: (the value that would, a harmless
one for a decoy key beside it)."""
ROOT_USERS = ["0", "root", "0:0", "00", "+0", "-0", "0:1000", "1000:0", "root:root", "000:0"]
PLACES = ("host-config", "top-level", "top-level-without-host-config", "second-host-config")
"""Where a host setting can sit in a create body: inside HostConfig; at the top level beside
it (merged for some keys); at the top level with HostConfig missing or null (used whole); in a
second object whose key folds to HostConfig (merged into the first)."""


@dataclass(frozen=True)
class Obj:
    """A JSON object as written, in order, duplicates kept (what `json.dumps` cannot write)."""

    pairs: tuple[tuple[str, Any], ...]

    def write(self, *, ascii_only: bool) -> str:
        return _write(self, ascii_only=ascii_only)


def _write(value: Any, *, ascii_only: bool) -> str:
    if isinstance(value, Obj):
        return "{" + ",".join(
            f"{json.dumps(key, ensure_ascii=ascii_only)}:{_write(item, ascii_only=ascii_only)}"
            for key, item in value.pairs
        ) + "}"  # fmt: skip
    return json.dumps(value, ensure_ascii=ascii_only)


def spelling(key: str) -> st.SearchStrategy[str]:
    """`key` with each letter in either case, `s`/`k` sometimes as Go 1.19's folds (ſ, K)."""

    def letter(char: str) -> st.SearchStrategy[str]:
        options = {char.lower(), char.upper()}
        options |= {"s": {"\u017f"}, "k": {"\u212a"}}.get(char.lower(), set())
        return st.sampled_from(sorted(options))

    return st.tuples(*(letter(char) for char in key)).map("".join)


def safe_host() -> list[tuple[str, Any]]:
    return [
        ("Memory", 64 * MIB), ("MemorySwap", 64 * MIB), ("NanoCpus", 500_000_000),
        ("PidsLimit", 64), ("ReadonlyRootfs", True), ("NetworkMode", "none"),
        ("CapDrop", ["ALL"]), ("SecurityOpt", ["no-new-privileges"]),
        ("Tmpfs", {"/tmp": "rw,nosuid,nodev,size=16m"}), ("Init", True),
    ]  # fmt: skip


def safe_top(label: str) -> list[tuple[str, Any]]:
    return [
        ("User", "1000:1000"), ("Image", "baton-sandbox:2"), ("Cmd", ["sleep", "60"]),
        ("WorkingDir", "/workspace"), ("Volumes", {"/workspace": {}}),
        ("Labels", {"baton.sandbox": "1", TEST_LABEL: label}),
    ]  # fmt: skip


@dataclass(frozen=True)
class Variant:
    """One spelling of a sensitive key, placed in a create body."""

    key: str
    spelled: str
    place: str
    decoy: str
    """"": none; "before"/"after": a harmless value under the canonical key, on that side."""
    host_spelled: str
    """How the second HostConfig's key is spelled (`second-host-config`)."""
    null_host_config: bool
    position: int
    ascii_only: bool

    def body(self, label: str) -> bytes:
        evil, harmless = SENSITIVE[self.key]
        host = [(key, value) for key, value in safe_host() if key != self.key]
        top = safe_top(label)
        inserted = [(self.spelled, evil)]
        if self.decoy:
            decoy = (self.key, harmless)
            inserted = [decoy, *inserted] if self.decoy == "before" else [*inserted, decoy]
        if self.place == "host-config":
            at = self.position % (len(host) + 1)
            host[at:at] = inserted
        if self.place == "top-level":
            top[self.position % (len(top) + 1) : 0] = inserted
        if self.place == "top-level-without-host-config":
            top += inserted
        if self.place != "top-level-without-host-config":
            top.append(("HostConfig", Obj(tuple(host))))
        elif self.null_host_config:
            top.append(("HostConfig", None))
        if self.place == "second-host-config":
            second = (self.host_spelled, Obj(tuple(inserted)))
            top.insert(len(top) - 1 if self.position % 2 else len(top), second)
        return Obj(tuple(top)).write(ascii_only=self.ascii_only).encode()


def variants(key: str, places: tuple[str, ...] = PLACES) -> st.SearchStrategy[Variant]:
    return st.builds(
        Variant,
        key=st.just(key),
        spelled=spelling(key),
        place=st.sampled_from(places),
        decoy=st.sampled_from(["", "before", "after"]),
        host_spelled=spelling("HostConfig"),
        null_host_config=st.booleans(),
        position=st.integers(0, 20),
        ascii_only=st.booleans(),
    )


def contained(info: dict[str, Any]) -> None:
    """What dockerd created is a sandbox: nothing of SENSITIVE reached it."""
    host = info["HostConfig"]
    assert host["Privileged"] is False
    assert not host["Binds"] and not host.get("Mounts") and not host["Devices"]
    assert all(mount["Type"] == "volume" for mount in info["Mounts"])
    assert not host["CapAdd"] and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["NetworkMode"] == "none"
    assert host["PidMode"] == "" and host["UsernsMode"] == "" and host["IpcMode"] != "host"
    assert host["Runtime"] == GATE_RUNTIME
    assert host["ReadonlyRootfs"] is True and info["Config"]["User"] == "1000:1000"


@pytest.fixture(scope="module")
def gate(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gate]:
    folder = tmp_path_factory.mktemp("gate-spelling")
    with started_gate(folder, "--runtime", GATE_RUNTIME, build_socket=True) as started:
        yield started


@pytest.fixture
def remove(docker_client: docker.DockerClient) -> Iterator[Callable[[str], None]]:
    """`remove(id)`: remove a container at once (and again at the end, if a test failed)."""
    made: list[str] = []

    def remove_now(container_id: str) -> None:
        made.append(container_id)
        docker_client.api.remove_container(container_id, force=True, v=True)

    yield remove_now
    for container_id in made:
        try:
            docker_client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass


def send(path: Path, body: bytes) -> tuple[int, Any]:
    return docker_request(path, "POST", "/v1.41/containers/create", body)


# -- controls: dockerd itself honours the variants ----------------------------------------------


def test_dockerd_merges_a_second_hostconfig_spelled_otherwise(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
) -> None:
    top = [*safe_top(session_label), ("HostConfig", Obj(tuple(safe_host()))),
           ("hostconfig", Obj((("Privileged", True),)))]  # fmt: skip
    body = Obj(tuple(top)).write(ascii_only=True).encode()
    status, created = send(DOCKERD, body)
    assert status == 201
    host = docker_client.api.inspect_container(created["Id"])["HostConfig"]
    remove(created["Id"])
    assert host["Privileged"] is True and host["CapDrop"] == ["ALL"]  # merged into the first
    status, answer = send(gate.socket, body)
    assert status == 403 and "name one setting" in answer["message"]


@pytest.mark.parametrize(
    ("spelled", "value", "read_as"),
    [("Bind\u017f", ["/tmp:/outside:ro"], "Binds"),
     ("\u017fecurityOpt", ["seccomp=unconfined"], "SecurityOpt"),
     ("\u212aernelMemory", 64 * MIB, "KernelMemory")],
)  # fmt: skip
def test_dockerd_folds_long_s_and_the_kelvin_sign_into_ascii_keys(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
    spelled: str,
    value: Any,
    read_as: str,
) -> None:
    host = [(key, item) for key, item in safe_host() if key != read_as] + [(spelled, value)]
    top = [*safe_top(session_label), ("HostConfig", Obj(tuple(host)))]
    for ascii_only in (True, False):  # `\u017f` and the UTF-8 bytes read alike
        body = Obj(tuple(top)).write(ascii_only=ascii_only).encode()
        status, created = send(DOCKERD, body)
        assert status == 201
        got = docker_client.api.inspect_container(created["Id"])["HostConfig"][read_as]
        remove(created["Id"])
        assert got == value
        status, answer = send(gate.socket, body)
        assert status == 403 and "is not ASCII" in answer["message"]


@pytest.mark.parametrize(
    ("with_host_config", "key", "value", "honoured"),
    [
        (False, "Privileged", True, True),
        (False, "CapAdd", ["SYS_ADMIN"], True),
        ("null", "Privileged", True, True),
        (True, "Privileged", True, False),
        (True, "Memory", 96 * MIB, True),
    ],
    ids=["no-host-config", "no-host-config-capadd", "host-config-null", "beside-host-config",
         "memory-merged"],
)  # fmt: skip
def test_dockerd_reads_host_settings_at_the_top_level(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
    with_host_config: bool | str,
    key: str,
    value: Any,
    honoured: bool,
) -> None:
    """The create body embeds a deprecated HostConfig: used whole when `HostConfig` is missing,
    five of its fields (Memory, MemorySwap, CpuShares, CpusetCpus, VolumeDriver) merged in
    when it is there (with_host_config: Memory 64 MiB set, then 0 here to see the merge)."""
    top = [*safe_top(session_label), (key, value)]
    if with_host_config is True:
        host = [(k, v) for k, v in safe_host() if k not in ("Memory", "MemorySwap")]
        top.append(("HostConfig", Obj(tuple(host))))
    elif with_host_config == "null":
        top.append(("HostConfig", None))
    body = Obj(tuple(top)).write(ascii_only=True).encode()
    status, created = send(DOCKERD, body)
    assert status == 201
    got = docker_client.api.inspect_container(created["Id"])["HostConfig"][key]
    remove(created["Id"])
    assert (got == value) is honoured
    status, answer = send(gate.socket, body)
    assert status == 403 and f"the body: the key '{key}'" in answer["message"]


@pytest.fixture
def running_box(
    docker_client: docker.DockerClient, session_label: str, remove: Callable[[str], None]
) -> Iterator[str]:
    """A hardened sandbox, started straight on dockerd, for execs (created, never started)."""
    body = Obj((*safe_top(session_label), ("HostConfig", Obj(tuple(safe_host()))))).write(
        ascii_only=True
    )
    status, created = send(DOCKERD, body.encode())
    assert status == 201
    docker_client.api.start(created["Id"])
    yield created["Id"]
    remove(created["Id"])


@pytest.mark.parametrize(
    ("body", "field", "dockerd_reads"),
    [
        (b'{"Cmd": ["id"], "Privileged": false, "privileged": true}', "privileged", True),
        (b'{"Cmd": ["id"], "PRIVILEGED": true}', "privileged", True),
        (b'{"Cmd": ["id"], "User": "1000:1000", "uSer": "0"}', "user", "0"),
        (b'{"Cmd": ["id"], "u\\u017fer": "root"}', "user", "root"),
    ],
)
def test_dockerd_honours_a_spelled_exec_setting_and_the_gate_refuses_it(
    gate: Gate,
    docker_client: docker.DockerClient,
    running_box: str,
    body: bytes,
    field: str,
    dockerd_reads: Any,
) -> None:
    status, created = docker_request(DOCKERD, "POST", f"/v1.41/containers/{running_box}/exec", body)
    assert status == 201  # created, never started
    assert docker_client.api.exec_inspect(created["Id"])["ProcessConfig"][field] == dockerd_reads
    target = f"/v1.41/containers/{running_box}/exec"
    status, answer = docker_request(gate.socket, "POST", target, body)
    assert status == 403, answer


def test_dockerd_replaces_the_host_config_with_a_v1_23_start_body(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
) -> None:
    """The container runs `true` with Docker's defaults: every capability, a writable root."""
    top = [(k, v) for k, v in safe_top(session_label) if k != "Cmd"] + [("Cmd", ["true"])]
    body = Obj((*top, ("HostConfig", Obj(tuple(safe_host()))))).write(ascii_only=True).encode()
    start_body = b'{"Dns": ["192.0.2.53"]}'
    for socket_path in (gate.socket, DOCKERD):
        status, created = send(DOCKERD, body)
        assert status == 201
        target = f"/v1.23/containers/{created['Id']}/start"
        status, answer = docker_request(socket_path, "POST", target, start_body)
        host = docker_client.api.inspect_container(created["Id"])["HostConfig"]
        remove(created["Id"])
        if socket_path == DOCKERD:
            assert status == 204 and host["Dns"] == ["192.0.2.53"]
            assert host["CapDrop"] is None and host["ReadonlyRootfs"] is False
        else:
            assert status == 403 and "API version 'v1.23'" in answer["message"]
            assert host["CapDrop"] == ["ALL"] and not host["Dns"]


def test_dockerd_commits_a_spelled_user_and_changes_and_the_build_socket_refuses_them(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
) -> None:
    labels = {"baton.sandbox": "1", "baton.build": "1", TEST_LABEL: session_label}
    top = [(k, v) for k, v in safe_top(session_label) if k != "Labels"] + [("Labels", labels)]
    body = Obj((*top, ("HostConfig", Obj(tuple(safe_host()))))).write(ascii_only=True).encode()
    status, created = send(DOCKERD, body)
    assert status == 201
    tag = f"spelled{session_label}"
    config = b'{"User": "1000:1000", "uSER": "0:0", "Labels": {"baton.env.key": "x"}}'
    assert gate.build_socket is not None
    try:
        for query in (f"repo=baton-env&tag={tag}", f"repo=baton-env&tag={tag}&changes=USER%200"):
            target = f"/v1.41/commit?container={created['Id']}&{query}"
            status, answer = docker_request(gate.build_socket, "POST", target, config)
            assert status == 403, answer
            direct = config.replace(b', "uSER": "0:0"', b"") if "changes" in query else config
            status, image = docker_request(DOCKERD, "POST", target, direct)
            assert status == 201
            committed = docker_client.api.inspect_image(image["Id"])["Config"]
            docker_client.api.remove_image(image["Id"], force=True)
            assert committed["User"] in ("0:0", "0")
            assert committed["Labels"]["baton.build"] == "1"  # copied from the container
    finally:
        remove(created["Id"])


@settings(max_examples=CONTROL_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    variant=variants("Privileged", ("host-config", "top-level-without-host-config",
                                    "second-host-config"))
)  # fmt: skip
def test_dockerd_honours_generated_variants_of_privileged(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
    variant: Variant,
) -> None:
    """The generator makes variants dockerd reads: when nothing but the variant names the key
    (no exact duplicate, the decoy before it), dockerd creates a privileged container."""
    if variant.decoy == "after" or variant.host_spelled == "HostConfig":
        variant = Variant(**{**variant.__dict__, "decoy": "before", "host_spelled": "hostConfig"})
    body = variant.body(session_label)
    status, created = send(DOCKERD, body)
    assert status == 201, created
    privileged = docker_client.api.inspect_container(created["Id"])["HostConfig"]["Privileged"]
    remove(created["Id"])
    assert privileged is True
    assert send(gate.socket, body)[0] == 403


# -- the property: through the gate, every variant is refused or neutralised --------------------


@pytest.mark.parametrize("key", list(SENSITIVE))
def test_no_spelling_of_a_host_setting_gets_past_the_gate(
    gate: Gate,
    docker_client: docker.DockerClient,
    session_label: str,
    remove: Callable[[str], None],
    key: str,
) -> None:
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES_PER_KEY, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(variant=variants(key))
    def check(variant: Variant) -> None:
        status, answer = send(gate.socket, variant.body(session_label))
        if status == 403:
            outcomes["refused"] += 1
            return
        assert status == 201, answer
        info = docker_client.api.inspect_container(answer["Id"])
        remove(answer["Id"])
        contained(info)
        outcomes["neutralised"] += 1

    check()
    print(f"{key}: {dict(outcomes)}")
    assert sum(outcomes.values()) >= EXAMPLES_PER_KEY
    assert outcomes["neutralised"] == 0 or key == "Runtime"


@st.composite
def exec_bodies(draw: st.DrawFn, key: str) -> bytes:
    evil = True if key == "Privileged" else draw(st.sampled_from(ROOT_USERS))
    harmless: Any = False if key == "Privileged" else "1000:1000"
    pairs: list[tuple[str, Any]] = [("Cmd", ["id"]), ("AttachStdout", True)]
    inserted = [(draw(spelling(key)), evil)]
    decoy = draw(st.sampled_from(["", "before", "after"]))
    if decoy:
        inserted.insert(0 if decoy == "before" else 1, (draw(spelling(key)), harmless))
    at = draw(st.integers(0, len(pairs)))
    pairs[at:at] = inserted
    return Obj(tuple(pairs)).write(ascii_only=draw(st.booleans())).encode()


@pytest.mark.parametrize("key", ["Privileged", "User"])
def test_no_spelling_of_an_exec_setting_gets_past_the_gate(
    gate: Gate, docker_client: docker.DockerClient, running_box: str, key: str
) -> None:
    outcomes: Counter[str] = Counter()
    target = f"/v1.41/containers/{running_box}/exec"

    @settings(max_examples=EXAMPLES_PER_KEY, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(body=exec_bodies(key))
    def check(body: bytes) -> None:
        status, answer = docker_request(gate.socket, "POST", target, body)
        if status == 403:
            outcomes["refused"] += 1
            return
        assert status == 201, answer
        process = docker_client.api.exec_inspect(answer["Id"])["ProcessConfig"]
        assert process["privileged"] is False and process["user"] == "1000:1000"
        outcomes["neutralised"] += 1

    check()
    print(f"exec {key}: {dict(outcomes)}")
    assert sum(outcomes.values()) >= EXAMPLES_PER_KEY


def test_no_container_the_spelling_tests_made_is_left(
    docker_client: docker.DockerClient, session_label: str
) -> None:
    left = docker_client.api.containers(
        all=True, filters={"label": f"{TEST_LABEL}={session_label}"}
    )
    inspected = [docker_client.api.inspect_container(c["Id"]) for c in left]
    assert [info["Id"] for info in inspected if info["HostConfig"]["Privileged"]] == []

"""Building a repository's environment image, and proving it can run the repository's tests.

    built = build_environment(spec, tree, tag="baton-env:<key>", settings=BuildSettings())
    baseline = validate_environment(built, spec, tree)

The build is the setup phase: a container from the base image, with no secret, gets the
repository's tree at the workspace path, installs the spec's Debian packages and runs its setup
commands as root, takes the tree's own files out again and is committed as the environment image,
which keeps what the setup built in the workspace and git does not track (compiled modules,
generated files: its products) at `WORKSPACE_SEED`. A sandbox's workspace (a tmpfs of its own)
starts with a copy of them and gets its run's commit laid over them, so every tracked file is the
run's. Those commands are the repository's own (its `setup.py` runs at `pip install -e .`):
untrusted code. So the build container runs under the sandboxes' runtime (gVisor's runsc where one
is set), with the least capabilities installing needs and NO network: its only way out is the
egress proxy (`sandbox.egress`), which this process serves for the build's length on a unix socket
bound into the container, and which connects to the package registries only — never to a link-local
(cloud metadata), loopback or private address. Registry settings (`BuildSettings`: the index URL,
an extra CA bundle, an upstream proxy) reach only the build's commands and the proxy, never the
image or the agent phase. A setup command that fails ends the build with `EnvironmentBuildError`,
naming the command and the tail of its output, and leaves no image.

Validation is the agent phase's first run: a hardened sandbox (no network, no capabilities,
read-only root) from the new image runs the test command on the unchanged tree. Its outcomes by
test id are the environment's baseline; output that names no test at all means the tests cannot
start, and that fails the environment too.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from pydantic import BaseModel, ConfigDict, Field

from sandbox import labels as label
from sandbox.client import connected, remove, translated
from sandbox.config import IMAGE_TAG, SandboxConfig
from sandbox.docker import WORKSPACE_SEED, DockerSandbox
from sandbox.egress import (
    DEFAULT_REGISTRIES,
    PROXY_URL,
    PROXY_VARIABLES,
    RELAY,
    RELAY_PORT,
    EgressPolicy,
    EgressProxy,
    with_registries,
)
from sandbox.environment import BASE_PATH, EnvironmentSpec
from sandbox.errors import SandboxError
from sandbox.models import ExecResult

logger = logging.getLogger(__name__)

ENV_REPOSITORY = "baton-env"
"""Environment images are `baton-env:<key>`."""
KEY_LABEL = "baton.env.key"
"""Every environment image carries its key, so `baton env ls` and pruning can find them."""
SPEC_LABEL = "baton.env.spec"
"""… and the spec it was built from, as JSON."""
BUILD_LABEL = "baton.build"
"""Marks a build container (besides the sandbox labels the reaper reads)."""

CA_PATH = "/run/baton-build/ca.crt"
"""Where a build container sees the extra CA bundle (bind-mounted, so never in a layer)."""
EGRESS_PATH = "/run/baton-egress"
"""Where a build container sees the folder of the egress proxy's socket (bind-mounted
read-only): its only way to the package registries (sandbox/egress.py)."""
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "npm_config_cafile",
)
"""The variables that point pip, requests, curl, git, Node and npm at a CA bundle."""
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

BUILD_ENV = {
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
    "npm_config_cache": "/tmp/npm-cache",
    "npm_config_update_notifier": "false",
    "npm_config_fund": "false",
    "npm_config_audit": "false",
}
"""The whole environment of a build's commands, apart from the spec's and the registry
settings: nothing is copied from the worker's own environment."""

AGENT_ENV = {"HOME": "/tmp", "LANG": "C.UTF-8", "PATH": BASE_PATH}
"""An environment image's own variables, under the spec's."""
APT_INSTALL = (
    "apt-get update -qq && apt-get install -y -qq --no-install-recommends {packages} "
    "&& rm -rf /var/lib/apt/lists/*"
)
NODE_MODULES = "/opt/baton/node_modules"
OUT_OF_TREE = (
    "if [ -d {workspace}/node_modules ] && [ ! -L {workspace}/node_modules ]; then "
    f"mkdir -p /opt/baton && mv {{workspace}}/node_modules {NODE_MODULES} && "
    f"ln -s {NODE_MODULES} {{workspace}}/node_modules; fi"
)
"""What `npm` installed into the tree moves out of it, to `NODE_MODULES`, and a symlink in the
tree's place leads there: a sandbox's workspace volume starts with the link, not with a copy of
every package."""
KEEP_PRODUCTS = (Path(__file__).parent / "products.py").read_text(encoding="utf-8")
"""The script (`sandbox.products`) that keeps, after the setup, what it built in the workspace."""
MOVE_TO_SEED = (
    f'mkdir -p {WORKSPACE_SEED} && find "$1" -mindepth 1 -maxdepth 1 '
    f"-exec mv -t {WORKSPACE_SEED} {{}} +"
)
"""Moves the workspace's contents (its first argument) to `WORKSPACE_SEED`."""
CLEAN_CACHES = "rm -rf /root/.cache /root/.npm /tmp/* /var/lib/apt/lists/*"
BUILD_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"]
"""What installing packages needs as root (apt drops to its `_apt` user, npm chowns)."""
EGRESS_PREFLIGHT = """\
import socket, sys, time
socket.socket(socket.AF_UNIX).connect(sys.argv[1])
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the relay does not listen")
"""
"""Run before the first command: connects to the proxy's socket once, so that a runtime that
forbids it (gVisor without `--host-uds=open`) is named at once rather than as a failed
download, and waits until the relay listens."""
LOG_TAIL_LINES = 40
MAX_PRODUCTS = 20_000
"""Most separate products a setup may leave in the workspace (a folder of them is one)."""
MAX_TEST_OUTPUT_BYTES = 64_000_000
"""Output kept of the validating test run: its per-test lines come last (pytest's summary)."""

Progress = Callable[[str], None]


class EnvironmentBuildError(SandboxError, RuntimeError):
    """Raised when the setup phase fails: a setup command exited non-zero or timed out (or
    another worker's build of the same key did, recently). The message names the command and
    ends with the tail of its output; no image was made."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.log))


class EnvironmentValidationError(SandboxError, RuntimeError):
    """Raised when an environment cannot run the repository's tests: the test command named no
    test at all and failed. The message names the command and ends with the tail of its
    output."""


class BuildSettings(BaseModel):
    """What a build may need to reach the package registries (`BATON_BUILD__*`). Build-time
    only: none of it reaches the image or the agent phase."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Off: code stages run in the base image, as they did before environments."""
    ca_bundle: Path | None = HOST_CA_BUNDLE if HOST_CA_BUNDLE.is_file() else None
    """A CA bundle (PEM) the registries' certificates chain to: the host's by default, which
    holds the public roots and any local mirror's."""
    index_url: str | None = None
    """pip's index (`PIP_INDEX_URL`); None: PyPI."""
    npm_registry: str | None = None
    """npm's registry; None: registry.npmjs.org."""
    proxy: str | None = None
    """`http://host:port` of an HTTP proxy the egress proxy goes through to the registries."""
    egress_allow: tuple[str, ...] = ()
    """More registries a build may reach, by name (`crates.io`, `mirror.example:8443`),
    besides PyPI, Debian, npm and the hosts of `index_url` and `npm_registry`."""
    egress_allow_private: bool = False
    """Let a registry's name resolve to a private address (a mirror inside your network);
    loopback and link-local addresses stay refused."""
    egress_dir: Path | None = None
    """Where this process puts the egress proxy's socket for a build; None: a new temporary
    folder per build (dockerd must then run on this machine, as on one-machine set-ups)."""
    egress_source: str | None = None
    """How dockerd names `egress_dir` for the build container's bind: a host path or a Docker
    volume's name (Compose, Kubernetes); None: `egress_dir`'s own path."""
    runtime: str | None = None
    """The OCI runtime of build containers; the workers set it to the sandboxes' (runsc),
    which must then be registered with `--host-uds=open` (docs/security.md)."""
    handoff: bool = False
    """This worker may not create build containers (it holds the sandbox gate's ordinary
    socket): it asks the builder that shares its Docker daemon (`baton worker --builder`)."""
    base_image: str = IMAGE_TAG
    memory_mb: int = Field(4096, ge=256)
    cpus: float = Field(2.0, gt=0)
    command_timeout_s: float = Field(1800.0, gt=0)
    """Most time one setup command may take."""
    test_timeout_s: float = Field(1800.0, gt=0)
    """Most time the validating test run may take."""

    def command_env(self) -> dict[str, str]:
        """The registry variables of a build's commands: the relay as their proxy."""
        env = dict.fromkeys(PROXY_VARIABLES, PROXY_URL)
        if self.ca_bundle is not None:
            env.update({name: CA_PATH for name in CA_VARIABLES})
        if self.index_url:
            env["PIP_INDEX_URL"] = self.index_url
        if self.npm_registry:
            env["npm_config_registry"] = self.npm_registry
        return env

    def egress_policy(self) -> EgressPolicy:
        """Where the egress proxy lets a build connect."""
        policy = EgressPolicy(
            hosts=frozenset({*DEFAULT_REGISTRIES, *self.egress_allow}),
            allow_private=self.egress_allow_private,
            upstream=self.proxy,
        )
        return with_registries(policy, (self.index_url, self.npm_registry))


@dataclass(frozen=True)
class BuiltEnvironment:
    """An environment image, as its build left it."""

    tag: str
    image_id: str
    size_bytes: int
    build_s: float
    log: str = field(repr=False)
    """Every setup command and its output, in order."""
    products: tuple[str, ...] = ()
    """What the setup built in the workspace, kept in the image (`KEEP_PRODUCTS`)."""


@dataclass(frozen=True)
class Baseline:
    """What the repository's tests did in the new environment, on the unchanged tree."""

    command: str
    exit_code: int | None
    output: str = field(repr=False)
    duration_s: float = 0.0


def build_environment(
    spec: EnvironmentSpec,
    tree: bytes,
    *,
    tag: str,
    settings: BuildSettings | None = None,
    workspace: str = SandboxConfig().workspace,
    user: tuple[int, int] = SandboxConfig().uid_gid,
    labels: Mapping[str, str] | None = None,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
) -> BuiltEnvironment:
    """Run the setup phase for `spec` on `tree` (a tar of the repository) and commit the result
    as `tag`, the workspace holding what the setup built there (its products: `KEEP_PRODUCTS`),
    owned by `user`, the sandboxes' uid and gid.

    Raises:
        EnvironmentBuildError: a setup command failed or timed out; no image is left.
        SandboxError: Docker failed (the base image is missing, the daemon is gone, …).
    """
    settings = settings or BuildSettings()
    say = progress or (lambda line: logger.info("%s", line))
    steps = _steps(spec, workspace)
    started = time.monotonic()
    log: list[str] = []
    with connected(client) as docker_client, _egress(settings) as (source, socket_name):
        box, build_labels = _start_build_container(
            docker_client, settings, spec, workspace, labels or {}, source, socket_name
        )
        try:
            _check_egress(box, socket_name)
            _unpack(box, workspace, tree)
            env = {**BUILD_ENV, **spec.env, **settings.command_env()}
            for number, command in enumerate(steps, 1):
                say(f"[{number}/{len(steps)}] {command}")
                result = box.exec(
                    ["sh", "-c", command],
                    env=env,
                    timeout_s=settings.command_timeout_s,
                    max_output_bytes=4_000_000,
                )
                outcome = f"[{result.status} in {result.duration_s:.1f}s]"
                log.append(f"$ {command}\n{result.output}\n{outcome}\n")
                if result.status != "ok":
                    _failed(command, result, "".join(log))
            products = _keep_products(box, workspace, tree, user)
            _move_to_seed(box, workspace)
            image_id = _commit(docker_client, box.id, tag, spec, workspace, build_labels)
        finally:
            remove(docker_client, box.id)
        size = int(docker_client.api.inspect_image(image_id)["Size"])
    took = round(time.monotonic() - started, 2)
    built = BuiltEnvironment(tag, image_id, size, took, "".join(log), products)
    kept = f", {len(products)} build products kept" if products else ""
    say(f"built {tag} ({size / 1e6:.0f} MB{kept}) in {built.build_s:.0f} s")
    return built


def validate_environment(
    tag: str,
    spec: EnvironmentSpec,
    tree: bytes,
    *,
    test_command: str,
    config: SandboxConfig | None = None,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = 1800.0,
    client: docker.DockerClient | None = None,
) -> Baseline:
    """Run `test_command` on the unchanged `tree` in a hardened sandbox from `tag`, as a stage
    would; what it printed is the baseline (the caller reads the outcomes from it)."""
    cfg = agent_config(config or SandboxConfig(), tag, spec)
    with DockerSandbox.start(cfg, labels=labels or {}, env=dict(spec.env), client=client) as box:
        box.put_archive(cfg.workspace, tree)
        result = box.exec(
            ["sh", "-c", test_command], timeout_s=timeout_s, max_output_bytes=MAX_TEST_OUTPUT_BYTES
        )
    return Baseline(test_command, result.exit_code, result.output, result.duration_s)


def agent_config(config: SandboxConfig, tag: str, spec: EnvironmentSpec) -> SandboxConfig:
    """The agent phase's sandbox settings for an environment: `config`'s, from its image, with
    the spec's resource limits where it sets them."""
    limits = spec.limits.model_dump(exclude_none=True)
    return SandboxConfig.model_validate({**config.model_dump(), **limits, "image": tag})


def environment_tag(key: str) -> str:
    return f"{ENV_REPOSITORY}:{key}"


def _steps(spec: EnvironmentSpec, workspace: str) -> list[str]:
    steps = []
    if spec.packages:
        steps.append(APT_INSTALL.format(packages=" ".join(spec.packages)))
    steps += [f"cd {workspace} && {command}" for command in spec.setup]
    steps.append(OUT_OF_TREE.format(workspace=workspace))
    return steps


def _keep_products(
    box: DockerSandbox, workspace: str, tree: bytes, user: tuple[int, int]
) -> tuple[str, ...]:
    """Take the tree's files out of the workspace and keep what the setup made; those products
    (`KEEP_PRODUCTS`). The caches go too."""
    names = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in tree_paths(tree))
    uid, gid = user
    argv = ["python3", "-c", KEEP_PRODUCTS, workspace, str(uid), str(gid)]
    result = box.exec(argv, stdin=names, timeout_s=600, max_output_bytes=16_000_000)
    if result.exit_code != 0:
        raise EnvironmentBuildError(
            f"the build products could not be kept: {result.output.strip()[-500:]}"
        )
    box.exec(["sh", "-c", CLEAN_CACHES], timeout_s=600)
    try:
        products = json.loads(result.output.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise EnvironmentBuildError(f"the build products' list is unreadable: {exc}") from exc
    return _checked_products(products)


def _move_to_seed(box: DockerSandbox, workspace: str) -> None:
    """Move what the workspace keeps to `WORKSPACE_SEED`, which a sandbox copies into its own
    workspace (a fresh tmpfs, `SandboxConfig.workspace_mb`) when it starts."""
    result = box.exec(["sh", "-c", MOVE_TO_SEED, "sh", workspace], timeout_s=600)
    if result.exit_code != 0:
        raise EnvironmentBuildError(
            f"the build products could not be moved to {WORKSPACE_SEED}: "
            f"{result.output.strip()[-500:]}"
        )


def _checked_products(products: Any) -> tuple[str, ...]:
    """The list the build container printed, read as what a hostile setup may have made of it
    (it ran as root there): paths inside the workspace, at most `MAX_PRODUCTS`."""
    if not isinstance(products, list) or not all(isinstance(p, str) for p in products):
        raise EnvironmentBuildError("the build products' list is not a list of paths")
    if len(products) > MAX_PRODUCTS:
        raise EnvironmentBuildError(
            f"the setup left {len(products)} separate products in the workspace, more than "
            f"{MAX_PRODUCTS}: build into a folder of its own (build/, dist/)"
        )
    for name in products:
        parts = name.rstrip("/").split("/")
        if not name.rstrip("/") or name.startswith("/") or "\0" in name or ".." in parts:
            raise EnvironmentBuildError(f"the build products' list holds {name!r}")
    return tuple(products)


def tree_paths(tree: bytes) -> list[str]:
    """The paths of the files and links in `tree` (a tar of a repository's tree)."""
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        return [m.name.removesuffix("/") for m in archive.getmembers() if not m.isdir()]


@contextmanager
def _egress(settings: BuildSettings) -> Iterator[tuple[str, str]]:
    """Serve the egress proxy for one build: how dockerd names its socket's folder, and the
    socket's name in it."""
    folder = settings.egress_dir
    own = folder is None
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="baton-egress-"))
        folder.chmod(0o755)
    name = f"{uuid.uuid4().hex[:16]}.sock"
    try:
        with EgressProxy(settings.egress_policy(), folder / name):
            yield settings.egress_source or str(folder), name
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def _unpack(box: DockerSandbox, workspace: str, tree: bytes) -> None:
    """The tree into the workspace by `tar` inside the container, not the archive API: gVisor
    does not see files written into a running container's root from outside."""
    result = box.exec(["tar", "-x", "-C", workspace], stdin=tree, timeout_s=600)
    if result.exit_code != 0:
        raise EnvironmentBuildError(
            f"the repository's tree could not be unpacked into {workspace}: "
            f"{result.output.strip()[-300:]}"
        )


def _check_egress(box: DockerSandbox, socket_name: str) -> None:
    socket_path = f"{EGRESS_PATH}/{socket_name}"
    result = box.exec(
        ["python3", "-c", EGRESS_PREFLIGHT, socket_path, str(RELAY_PORT)], timeout_s=60
    )
    if result.exit_code != 0:
        raise EnvironmentBuildError(
            "the build container cannot reach the egress proxy's socket, its only way to the "
            "package registries (under gVisor, register runsc with --host-uds=open: "
            f"docs/security.md): {result.output.strip()[-300:]}"
        )


def _start_build_container(
    client: docker.DockerClient,
    settings: BuildSettings,
    spec: EnvironmentSpec,
    workspace: str,
    extra_labels: Mapping[str, str],
    egress_source: str,
    socket_name: str,
) -> tuple[DockerSandbox, dict[str, str]]:
    ttl_s = int(settings.command_timeout_s * (len(spec.setup) + 2))
    binds = {egress_source: {"bind": EGRESS_PATH, "mode": "ro"}}
    if settings.ca_bundle is not None:
        binds[str(settings.ca_bundle)] = {"bind": CA_PATH, "mode": "ro"}
    host_config = client.api.create_host_config(
        network_mode="none",
        cap_drop=["ALL"],
        cap_add=BUILD_CAPABILITIES,
        security_opt=["no-new-privileges"],
        pids_limit=4096,
        mem_limit=settings.memory_mb * 2**20,
        memswap_limit=settings.memory_mb * 2**20,
        nano_cpus=int(settings.cpus * 1e9),
        init=True,
        binds=binds,
        runtime=settings.runtime,
    )
    build_labels = {
        **extra_labels,
        BUILD_LABEL: "1",
        label.SANDBOX: "1",  # the reaper removes it if its worker dies mid-build
        label.EXPIRES: str(int(time.time()) + ttl_s),
        label.OWNER: label.owner(),
    }
    image = settings.base_image
    relay = ["python3", "-c", RELAY, f"{EGRESS_PATH}/{socket_name}", str(RELAY_PORT), str(ttl_s)]
    with translated(f"creating a build container from {image}", image=image):
        container_id: str = client.api.create_container(
            image,
            command=relay,
            name=f"baton-build-{uuid.uuid4().hex[:16]}",
            user="0:0",
            working_dir=workspace,
            environment={"PATH": BASE_PATH},
            labels=build_labels,
            host_config=host_config,
        )["Id"]
    try:
        with translated(f"starting build container {container_id[:12]}", image=image):
            client.api.start(container_id)
    except SandboxError:
        remove(client, container_id)
        raise
    cfg = SandboxConfig(image=image, workspace=workspace, max_output_bytes=4_000_000)
    return DockerSandbox(client, cfg, container_id, user="0:0"), build_labels


def _commit(
    client: docker.DockerClient,
    container_id: str,
    tag: str,
    spec: EnvironmentSpec,
    workspace: str,
    build_labels: Mapping[str, str],
) -> str:
    repository, _, version = tag.partition(":")
    env = {**AGENT_ENV, **spec.env}
    # Docker merges the container's labels into the image's: the build container's own are
    # blanked, or every sandbox started from the image would look like a build.
    labels = {name: "" for name in build_labels}
    labels.update({KEY_LABEL: version, SPEC_LABEL: spec.model_dump_json()})
    conf = {
        "Env": [f"{name}={value}" for name, value in env.items()],
        "User": "1000:1000",
        "WorkingDir": workspace,
        "Cmd": ["sleep", "infinity"],
        "Labels": labels,
    }
    with translated(f"committing the environment image {tag}"):
        committed = client.api.commit(container_id, repository=repository, tag=version, conf=conf)
    image_id: str = committed["Id"]
    return image_id


def _failed(command: str, result: ExecResult, log: str) -> None:
    tail = "\n".join(result.output.rstrip().splitlines()[-LOG_TAIL_LINES:])
    how = "timed out" if result.timed_out else f"exited with {result.exit_code}"
    if result.oom_killed:
        how = "ran out of memory"
    raise EnvironmentBuildError(f"setup command {command!r} {how}:\n{tail}", log)

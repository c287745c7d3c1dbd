"""Building a repository's environment image, and proving it can run the repository's tests.

    built = build_environment(spec, tree, tag="baton-env:<key>", settings=BuildSettings())
    baseline = validate_environment(built, spec, tree)

The build is the setup phase: a container from the base image, with network access to the
package registries and no secret, gets the repository's tree at the workspace path, installs
the spec's Debian packages and runs its setup commands as root, forgets the tree again and is
committed as the environment image. Registry settings (`BuildSettings`: the index URL, an extra
CA bundle, a proxy) reach only the build's commands, never the image or the agent phase. A
setup command that fails ends the build with `EnvironmentBuildError`, naming the command and
the tail of its output, and leaves no image.

Validation is the agent phase's first run: a hardened sandbox (no network, no capabilities,
read-only root) from the new image runs the test command on the unchanged tree. Its outcomes by
test id are the environment's baseline; output that names no test at all means the tests cannot
start, and that fails the environment too.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from pydantic import BaseModel, ConfigDict, Field

from sandbox import labels as label
from sandbox.client import connected, remove, translated
from sandbox.config import IMAGE_TAG, SandboxConfig
from sandbox.docker import DockerSandbox
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
FORGET = (
    "if [ -d {workspace}/node_modules ]; then mkdir -p /opt/baton && "
    f"mv {{workspace}}/node_modules {NODE_MODULES}; fi; "
    "find {workspace} -mindepth 1 -delete; "
    f"if [ -d {NODE_MODULES} ]; then ln -s {NODE_MODULES} {{workspace}}/node_modules; fi; "
    "rm -rf /root/.cache /root/.npm /tmp/* /var/lib/apt/lists/*"
)
"""Last build step: the tree goes (each stage copies in its own) and so do the caches. What
`npm` installed into the tree moves out of it, to `NODE_MODULES`, and a symlink in the tree's
place leads there: a sandbox's workspace volume starts with it."""
BUILD_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"]
"""What installing packages needs as root (apt drops to its `_apt` user, npm chowns)."""
LOG_TAIL_LINES = 40
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
    """An HTTP(S) proxy for the build's commands."""
    network: str = "bridge"
    """The Docker network a build container joins (it needs the registries)."""
    base_image: str = IMAGE_TAG
    memory_mb: int = Field(4096, ge=256)
    cpus: float = Field(2.0, gt=0)
    command_timeout_s: float = Field(1800.0, gt=0)
    """Most time one setup command may take."""
    test_timeout_s: float = Field(1800.0, gt=0)
    """Most time the validating test run may take."""

    def command_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.ca_bundle is not None:
            env.update({name: CA_PATH for name in CA_VARIABLES})
        if self.index_url:
            env["PIP_INDEX_URL"] = self.index_url
        if self.npm_registry:
            env["npm_config_registry"] = self.npm_registry
        if self.proxy:
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = self.proxy
        return env


@dataclass(frozen=True)
class BuiltEnvironment:
    """An environment image, as its build left it."""

    tag: str
    image_id: str
    size_bytes: int
    build_s: float
    log: str = field(repr=False)
    """Every setup command and its output, in order."""


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
    labels: Mapping[str, str] | None = None,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
) -> BuiltEnvironment:
    """Run the setup phase for `spec` on `tree` (a tar of the repository) and commit the result
    as `tag`.

    Raises:
        EnvironmentBuildError: a setup command failed or timed out; no image is left.
        SandboxError: Docker failed (the base image is missing, the daemon is gone, …).
    """
    settings = settings or BuildSettings()
    say = progress or (lambda line: logger.info("%s", line))
    steps = _steps(spec, workspace)
    started = time.monotonic()
    log: list[str] = []
    with connected(client) as docker_client:
        box, build_labels = _start_build_container(
            docker_client, settings, spec, workspace, labels or {}
        )
        try:
            box.put_archive(workspace, tree)
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
            image_id = _commit(docker_client, box.id, tag, spec, workspace, build_labels)
        finally:
            remove(docker_client, box.id)
        size = int(docker_client.api.inspect_image(image_id)["Size"])
    took = round(time.monotonic() - started, 2)
    built = BuiltEnvironment(tag, image_id, size, took, "".join(log))
    say(f"built {tag} ({size / 1e6:.0f} MB) in {built.build_s:.0f} s")
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
    steps.append(FORGET.format(workspace=workspace))
    return steps


def _start_build_container(
    client: docker.DockerClient,
    settings: BuildSettings,
    spec: EnvironmentSpec,
    workspace: str,
    extra_labels: Mapping[str, str],
) -> tuple[DockerSandbox, dict[str, str]]:
    ttl_s = int(settings.command_timeout_s * (len(spec.setup) + 2))
    binds = {}
    if settings.ca_bundle is not None:
        binds[str(settings.ca_bundle)] = {"bind": CA_PATH, "mode": "ro"}
    host_config = client.api.create_host_config(
        network_mode=settings.network,
        cap_drop=["ALL"],
        cap_add=BUILD_CAPABILITIES,
        security_opt=["no-new-privileges"],
        pids_limit=4096,
        mem_limit=settings.memory_mb * 2**20,
        memswap_limit=settings.memory_mb * 2**20,
        nano_cpus=int(settings.cpus * 1e9),
        init=True,
        binds=binds,
    )
    build_labels = {
        **extra_labels,
        BUILD_LABEL: "1",
        label.SANDBOX: "1",  # the reaper removes it if its worker dies mid-build
        label.EXPIRES: str(int(time.time()) + ttl_s),
        label.OWNER: label.owner(),
    }
    image = settings.base_image
    with translated(f"creating a build container from {image}", image=image):
        container_id: str = client.api.create_container(
            image,
            command=["sleep", str(ttl_s)],
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

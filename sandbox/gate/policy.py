"""What the gate lets through: its options, and one small rule per thing it refuses.

A rule reads a request's JSON body (or a container's labels) and answers None when the body
keeps it, or the reason it breaks it, a sentence that names the setting and says why. The shapes
allowed are the ones Baton itself sends: `sandbox.docker._create` for a sandbox, and
`sandbox.build._start_build_container` for an environment's build container, which alone may
add capabilities, join a network for the registries and see the host's CA bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandbox import labels as label
from sandbox.build import BUILD_CAPABILITIES, BUILD_LABEL, CA_PATH, ENV_REPOSITORY
from sandbox.config import IMAGE_TAG

DEFAULT_IMAGE_PREFIXES = (f"{IMAGE_TAG.partition(':')[0]}:", f"{ENV_REPOSITORY}:")
"""Baton's sandbox image (`baton-sandbox:<n>`) and its environment images (`baton-env:<key>`)."""
NO_NEW_PRIVILEGES = frozenset({"no-new-privileges", "no-new-privileges:true",
                               "no-new-privileges=true"})  # fmt: skip
"""The spellings of the one security option a sandbox carries; every other one is refused."""
SHARED_NAMESPACES = ("PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode", "Cgroup")
"""Modes that would share a namespace of the host (`host`) or of another container."""
LOG_DRIVERS = frozenset({"", "json-file", "local", "none"})
"""Log drivers that keep a container's output on the host (others send it somewhere)."""
FORBIDDEN_LISTS = (
    "Devices", "DeviceRequests", "DeviceCgroupRules", "VolumesFrom", "Links", "Sysctls",
    "ExtraHosts", "Capabilities", "Annotations", "PortBindings",
)  # fmt: skip
"""HostConfig settings Baton never uses, each of which reaches past the container: any value
other than an empty one is refused."""
HOST_CONFIG_KEYS = frozenset({
    "Memory", "MemorySwap", "MemoryReservation", "MemorySwappiness", "NanoCpus", "CpuShares",
    "CpuPeriod", "CpuQuota", "CpusetCpus", "CpusetMems", "PidsLimit", "Ulimits", "ShmSize",
    "ReadonlyRootfs", "Tmpfs", "Init", "AutoRemove", "RestartPolicy", "OomKillDisable",
    "OomScoreAdj", "LogConfig", "Runtime", "NetworkMode", "CapAdd", "CapDrop", "SecurityOpt",
    "Binds", "Mounts", "Privileged", "PublishAllPorts", "CgroupParent", "VolumeDriver",
    "MaskedPaths", "ReadonlyPaths", "Dns", "DnsOptions", "DnsSearch", "GroupAdd",
    "ConsoleSize", "Isolation", "BlkioWeight", *SHARED_NAMESPACES, *FORBIDDEN_LISTS,
})  # fmt: skip
"""HostConfig settings a rule reads or that stay inside the container; any other one with a
value is refused, so a setting Docker adds later is not let through unread."""


class GatePolicy(BaseModel):
    """The gate's options (`baton sandbox-gate --help`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_prefixes: tuple[str, ...] = DEFAULT_IMAGE_PREFIXES
    """A container's image must start with one of these, as the caller names it."""
    networks: frozenset[str] = frozenset()
    """Docker networks a container may join besides `none` (a build's, for the registries)."""
    ca_bundle: str | None = None
    """The host path of the CA bundle a build container may see read-only at `CA_PATH`; None:
    no bind mount at all."""
    runtime: str | None = None
    """Set: every sandbox runs under this OCI runtime (`runsc`), whatever the caller asked.
    Build containers keep dockerd's default: they need the network runsc is registered
    without (README, "Sandbox hosts"), and they run no model's commands."""


EMPTY: tuple[Any, ...] = (None, "", 0, False, [], {})
"""Values that set nothing."""

Body = Mapping[str, Any]
Rule = Callable[[GatePolicy, Body], str | None]


def _host(body: Body) -> Mapping[str, Any]:
    return body.get("HostConfig") or {}


def _is_build(body: Body) -> bool:
    return (body.get("Labels") or {}).get(BUILD_LABEL) == "1"


def _capability(name: str) -> str:
    return name.upper().removeprefix("CAP_")


# -- container creation -----------------------------------------------------------------------


def unlabelled(policy: GatePolicy, body: Body) -> str | None:
    if (body.get("Labels") or {}).get(label.SANDBOX) != "1":
        return f"the container is not labelled {label.SANDBOX_FILTER}, as every sandbox is"
    return None


def foreign_image(policy: GatePolicy, body: Body) -> str | None:
    image = str(body.get("Image") or "")
    if not image.startswith(policy.image_prefixes):
        allowed = ", ".join(f"{prefix}…" for prefix in policy.image_prefixes)
        return f"the image {image!r} is not one of Baton's ({allowed}; --allow-image-prefix)"
    return None


def privileged(policy: GatePolicy, body: Body) -> str | None:
    if _host(body).get("Privileged"):
        return "HostConfig.Privileged is true: sandboxes are never privileged"
    return None


def added_capabilities(policy: GatePolicy, body: Body) -> str | None:
    added = {_capability(name) for name in _host(body).get("CapAdd") or ()}
    if added and not _is_build(body):
        return f"HostConfig.CapAdd {sorted(added)}: only a build container adds capabilities"
    extra = added - set(BUILD_CAPABILITIES)
    if extra:
        return (
            f"HostConfig.CapAdd {sorted(extra)}: a build container adds only {BUILD_CAPABILITIES}"
        )
    return None


def kept_capabilities(policy: GatePolicy, body: Body) -> str | None:
    if "ALL" not in {_capability(name) for name in _host(body).get("CapDrop") or ()}:
        return "HostConfig.CapDrop does not hold ALL: sandboxes drop every capability"
    return None


def security_options(policy: GatePolicy, body: Body) -> str | None:
    options = set(_host(body).get("SecurityOpt") or ())
    if not options & NO_NEW_PRIVILEGES:
        return "HostConfig.SecurityOpt lacks no-new-privileges"
    other = sorted(options - NO_NEW_PRIVILEGES)
    if other:
        return (
            f"HostConfig.SecurityOpt {other}: sandboxes keep Docker's seccomp, AppArmor and labels"
        )
    return None


def mounts(policy: GatePolicy, body: Body) -> str | None:
    """Only the CA bundle, read-only, bound where a build reads it; tmpfs mounts are fine."""
    host = _host(body)
    allowed = {f"{policy.ca_bundle}:{CA_PATH}:ro"} if policy.ca_bundle else set()
    binds = [bind for bind in host.get("Binds") or () if bind not in allowed]
    if binds:
        return f"HostConfig.Binds {binds}: the only host path a sandbox sees is the CA bundle"
    kinds = sorted(
        {str(m.get("Type")) for m in host.get("Mounts") or () if m.get("Type") != "tmpfs"}
    )
    if kinds:
        return f"HostConfig.Mounts of type {kinds}: sandboxes mount only tmpfs"
    if host.get("VolumeDriver"):
        return "HostConfig.VolumeDriver is set: sandboxes' volumes are Docker's own"
    return None


def shared_namespaces(policy: GatePolicy, body: Body) -> str | None:
    host = _host(body)
    for key in SHARED_NAMESPACES:
        mode = str(host.get(key) or "")
        if mode == "host" or mode.startswith("container:"):
            return f"HostConfig.{key} is {mode!r}: sandboxes share no namespace"
    return None


def reaching_out(policy: GatePolicy, body: Body) -> str | None:
    """Devices, links, ports, sysctls, extra hosts, …: whatever reaches past the container."""
    host = _host(body)
    for key in FORBIDDEN_LISTS:
        if host.get(key):
            return f"HostConfig.{key} is set: Baton's sandboxes use none"
    if host.get("PublishAllPorts"):
        return "HostConfig.PublishAllPorts is true: sandboxes publish no port"
    if host.get("CgroupParent"):
        return "HostConfig.CgroupParent is set: sandboxes stay in Docker's cgroups"
    for key in ("MaskedPaths", "ReadonlyPaths"):
        if host.get(key) is not None:
            return f"HostConfig.{key} is set: sandboxes keep Docker's masked /proc paths"
    return None


def network(policy: GatePolicy, body: Body) -> str | None:
    mode = str(_host(body).get("NetworkMode") or "default")
    if mode != "none" and mode not in policy.networks:
        return f"HostConfig.NetworkMode {mode!r}: a sandbox has no network or an allowed one"
    joined = set((body.get("NetworkingConfig") or {}).get("EndpointsConfig") or {}) - {mode}
    if joined:
        return f"NetworkingConfig joins {sorted(joined)}: a sandbox joins only its NetworkMode"
    return None


def unlimited(policy: GatePolicy, body: Body) -> str | None:
    host = _host(body)
    if not host.get("Memory", 0) > 0:
        return "HostConfig.Memory is not set: every sandbox has a memory limit"
    if not host.get("PidsLimit", 0) > 0:
        return "HostConfig.PidsLimit is not set: every sandbox has a pids limit"
    return None


def log_driver(policy: GatePolicy, body: Body) -> str | None:
    driver = str((_host(body).get("LogConfig") or {}).get("Type") or "")
    if driver not in LOG_DRIVERS:
        return f"HostConfig.LogConfig.Type {driver!r}: a sandbox's output stays on the host"
    return None


def unknown_settings(policy: GatePolicy, body: Body) -> str | None:
    host = _host(body)
    unknown = sorted(key for key in host if key not in HOST_CONFIG_KEYS and host[key] not in EMPTY)
    if unknown:
        return f"HostConfig {unknown}: settings the gate does not know are refused"
    return None


CREATE_RULES: tuple[Rule, ...] = (
    unlabelled, foreign_image, privileged, added_capabilities, kept_capabilities,
    security_options, mounts, shared_namespaces, reaching_out, network, unlimited, log_driver,
    unknown_settings,
)  # fmt: skip


def create_refusal(policy: GatePolicy, body: Body) -> str | None:
    """Why `POST /containers/create` with `body` is refused; None if it is not."""
    for rule in CREATE_RULES:
        reason = rule(policy, body)
        if reason is not None:
            return reason
    return None


def with_runtime(policy: GatePolicy, body: Body) -> dict[str, Any]:
    """`body`, under the gate's runtime if it has one and `body` is a sandbox's."""
    if policy.runtime is None or _is_build(body):
        return dict(body)
    return {**body, "HostConfig": {**_host(body), "Runtime": policy.runtime}}


# -- existing containers, execs, images -------------------------------------------------------


def exec_refusal(policy: GatePolicy, body: Body) -> str | None:
    """Why `POST /containers/{id}/exec` with `body` is refused; None if it is not."""
    if body.get("Privileged"):
        return "the exec asks for Privileged: commands in a sandbox never are"
    return None


def not_a_sandbox(labels: Mapping[str, str]) -> str | None:
    if labels.get(label.SANDBOX) != "1":
        return f"the container is not labelled {label.SANDBOX_FILTER}: not a Baton sandbox"
    return None


def not_a_build(labels: Mapping[str, str]) -> str | None:
    if labels.get(BUILD_LABEL) != "1":
        return f"the container is not labelled {BUILD_LABEL}=1: only a build is committed"
    return None


def not_an_environment(repository: str) -> str | None:
    """Images the gate removes or commits are environments: `baton-env:<key>`."""
    name, _, tag = repository.partition(":")
    if name != ENV_REPOSITORY or not tag:
        return f"{repository!r} is not an environment image ({ENV_REPOSITORY}:<key>)"
    return None

"""What a create, exec or commit body may ask, and the body the gate forwards for it.

A body is decoded first (`decode.py`, `schema.py`): what reaches a rule has Docker's spellings
and strict types. A rule answers None when the body keeps it, or the reason it breaks it, a
sentence that names the setting and says what is allowed. Two container shapes pass, the ones
Baton sends: a sandbox (`sandbox.docker._create`: a non-root user, a read-only root, no
capability, no host path, no network or an allowed one) and, through the build socket only, a
build container (`sandbox.build`: root, a writable root, `BUILD_CAPABILITIES`, no network, the
CA bundle and the egress proxy's folder bound read-only). Both drop every capability first,
cannot gain privileges, have bounded memory, CPU and processes, and run under the gate's
runtime.

What is forwarded is rebuilt from the validated fields, in canonical spellings (`CapDrop`
`["ALL"]`, `SecurityOpt` `["no-new-privileges"]`, `User` `uid:gid`), never the caller's bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sandbox import labels as label
from sandbox.build import BUILD_CAPABILITIES, BUILD_LABEL
from sandbox.gate.decode import decode, encode
from sandbox.gate.errors import Refused
from sandbox.gate.policy import GatePolicy, image_refusal
from sandbox.gate.schema import (
    CommitBody,
    CreateBody,
    ExecBody,
    ExecStartBody,
    HostSettings,
    MountSettings,
)

NO_NEW_PRIVILEGES = frozenset({"no-new-privileges", "no-new-privileges:true",
                               "no-new-privileges=true"})  # fmt: skip
"""The spellings of the one security option a container carries; every other one is refused
(dockerd reads them in order, so `no-new-privileges=false` after it would undo it)."""
LOG_DRIVERS = frozenset({"json-file", "local", "none"})
"""Log drivers that keep a container's output on the host (others send it somewhere); unset,
dockerd's default applies, which is the operator's."""
LOG_OPTIONS = frozenset({"max-size", "max-file", "compress"})
"""The options of those drivers a container may set (not `labels`/`env`, which copy values)."""
WORKSPACE_SIZE = re.compile(r"size=[0-9]{1,9}m")
WORKSPACE_OPTION = re.compile(r"size=[0-9]{1,9}m|uid=[0-9]{1,10}|gid=[0-9]{1,10}|mode=[0-7]{3,4}"
                              r"|nosuid|nodev|noexec")  # fmt: skip
"""The tmpfs options (`o=`) a sandbox's workspace volume may have; its size is in MB."""
TMPFS_OPTION = re.compile(r"rw|ro|nosuid|nodev|noexec|exec|size=[0-9]+[kmg]?|mode=[0-7]{3,4}")
"""An option a tmpfs may have; `nosuid` and `nodev` are required."""
PATH = re.compile(r"(/[A-Za-z0-9_.-]+)+")
"""An absolute path inside a container, written plainly (no `.`/`..` parts, see `_plain`)."""
USER = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
"""`uid:gid` in digits: the only spelling dockerd does not resolve through the image's
/etc/passwd and /etc/group, which an environment's build (untrusted code, as root) wrote."""
MAX_ID = 2**31 - 1
"""Highest uid or gid dockerd accepts."""
BATON_LABELS = (label.SANDBOX, BUILD_LABEL, label.EXPIRES, label.OWNER)
"""The labels that make a container a sandbox or a build, and say when and whose."""


@dataclass(frozen=True)
class Shape:
    """What one kind of container may be."""

    name: str
    root: bool
    """It may run as uid or gid 0."""
    writable_root: bool
    """It may have a writable root file system."""
    capabilities: frozenset[str]
    """What it may add after dropping every capability."""
    build: bool

    def binds(self, policy: GatePolicy) -> frozenset[str]:
        return policy.build_binds() if self.build else frozenset()

    def networks(self, policy: GatePolicy) -> frozenset[str]:
        return frozenset({"none"}) | (frozenset() if self.build else policy.networks)

    def runtime(self, policy: GatePolicy) -> str | None:
        return policy.runtime_of_builds if self.build else policy.runtime


SANDBOX = Shape("sandbox", root=False, writable_root=False, capabilities=frozenset(), build=False)
BUILD = Shape("build container", root=True, writable_root=True,
              capabilities=frozenset(BUILD_CAPABILITIES), build=True)  # fmt: skip
Rule = Callable[[GatePolicy, Shape, CreateBody, HostSettings], "str | None"]


# -- pieces -------------------------------------------------------------------------------------


def user_refusal(user: str, *, root: bool, where: str) -> str | None:
    """Why `user` may not run a container's or an exec's processes; None if it may."""
    found = USER.fullmatch(user)
    if found is None:
        return (
            f"{where} {user[:40]!r} is not uid:gid in digits: a name or a lone uid is looked up "
            "in the image's /etc/passwd, which a build may have written"
        )
    uid, gid = int(found.group(1)), int(found.group(2))
    if uid > MAX_ID or gid > MAX_ID:
        return f"{where} {user!r} is out of range (ids are at most {MAX_ID})"
    if not root and (uid == 0 or gid == 0):
        return f"{where} {user!r} is root (uid or gid 0): only a build container runs as root"
    return None


def canonical_user(user: str) -> str:
    uid, gid = user.split(":")
    return f"{int(uid)}:{int(gid)}"


def capability(name: str) -> str:
    """A capability as dockerd reads it: case-insensitive, with or without `CAP_` (an ASCII
    name: dockerd upper-cases with Unicode's rules, under which `ſ` is `S`)."""
    return name.upper().removeprefix("CAP_")


def _plain(path: str) -> bool:
    parts = path.split("/")[1:]
    return bool(PATH.fullmatch(path)) and not {".", ".."} & set(parts) and parts[0] not in (
        "proc", "sys", "dev"
    )  # fmt: skip


# -- container creation -----------------------------------------------------------------------


def labelled(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    if (body.Labels or {}).get(label.SANDBOX) != "1":
        return f"the container is not labelled {label.SANDBOX_FILTER}, as every sandbox is"
    return None


def image(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    return image_refusal(policy, body.Image or "")


def user(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    return user_refusal(body.User or "", root=shape.root, where="User")


def root_file_system(
    policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings
) -> str | None:
    if host.ReadonlyRootfs is not True and not shape.writable_root:
        return "HostConfig.ReadonlyRootfs is not true: a sandbox's root file system is read-only"
    return None


def capabilities(
    policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings
) -> str | None:
    named = [*(host.CapDrop or ()), *(host.CapAdd or ())]
    if not all(name.isascii() for name in named):
        return "HostConfig.CapDrop or CapAdd names a capability in letters that are not ASCII"
    if "ALL" not in {capability(name) for name in host.CapDrop or ()}:
        return "HostConfig.CapDrop does not hold ALL: every container drops every capability"
    added = {capability(name) for name in host.CapAdd or ()}
    extra = sorted(added - shape.capabilities)
    if extra:
        allowed = sorted(shape.capabilities) or "none"
        return f"HostConfig.CapAdd {extra}: a {shape.name} adds {allowed}"
    return None


def security_options(
    policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings
) -> str | None:
    options = host.SecurityOpt or []
    if not options:
        return "HostConfig.SecurityOpt lacks no-new-privileges"
    other = sorted(set(options) - NO_NEW_PRIVILEGES)
    if other:
        return f"HostConfig.SecurityOpt {other}: containers keep Docker's seccomp and AppArmor"
    return None


def binds(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    allowed = shape.binds(policy)
    extra = [bind for bind in host.Binds or () if bind not in allowed]
    if extra:
        said = sorted(allowed) or "none"
        return f"HostConfig.Binds {extra}: the host paths a {shape.name} may see are {said}"
    return None


def network(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    mode = host.NetworkMode or ""
    if mode not in shape.networks(policy):
        return f"HostConfig.NetworkMode {mode!r}: a {shape.name} has no network (none)" + (
            "" if shape.build else " or one allowed by --allow-network"
        )
    return None


def limits(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    memory, most_memory = host.Memory or 0, policy.max_memory_mb * 2**20
    if not 0 < memory <= most_memory:
        return f"HostConfig.Memory {memory}: between 1 and {most_memory} bytes (--max-memory-mb)"
    if host.MemorySwap != memory:
        return "HostConfig.MemorySwap is not Memory: containers do not swap"
    cpus, most_cpus = host.NanoCpus or 0, int(policy.max_cpus * 1e9)
    if not 0 < cpus <= most_cpus:
        return f"HostConfig.NanoCpus {cpus}: between 1 and {most_cpus} (--max-cpus)"
    pids = host.PidsLimit or 0
    if not 0 < pids <= policy.max_pids:
        return f"HostConfig.PidsLimit {pids}: between 1 and {policy.max_pids} (--max-pids)"
    return None


def logs(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    settings = host.LogConfig
    if settings is None:
        return None
    if settings.Type not in (None, "", *LOG_DRIVERS):
        return f"HostConfig.LogConfig.Type {settings.Type!r}: container output stays on the host"
    extra = sorted(set(settings.Config or {}) - LOG_OPTIONS)
    if extra:
        return f"HostConfig.LogConfig.Config {extra}: only {sorted(LOG_OPTIONS)}"
    return None


def filesystems(
    policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings
) -> str | None:
    """tmpfs mounts, and the one anonymous volume: the working directory."""
    for path, options in (host.Tmpfs or {}).items():
        tokens = options.split(",")
        if not _plain(path):
            return f"HostConfig.Tmpfs {path!r}: an absolute path outside /proc, /sys and /dev"
        if not all(TMPFS_OPTION.fullmatch(token) for token in tokens) or not {
            "nosuid", "nodev"
        } <= set(tokens):  # fmt: skip
            return f"HostConfig.Tmpfs {path!r}: options {options!r} (nosuid and nodev, a size)"
    volumes = sorted(body.Volumes or {})
    if volumes and not shape.build:
        return (
            f"Volumes {volumes}: a sandbox's workspace is a tmpfs volume of a bounded size "
            "(HostConfig.Mounts), never an anonymous volume on the host's disk"
        )
    if volumes and (volumes != [body.WorkingDir] or not _plain(volumes[0])):
        return f"Volumes {volumes}: a container's only volume is its working directory"
    return None


def workspace(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    """A sandbox has one mount, its workspace: Docker's local driver on a tmpfs of at most
    `--max-workspace-mb`, nosuid and nodev (`sandbox.docker.workspace_mount`); a build none."""
    mounts = host.Mounts or []
    if shape.build:
        return "HostConfig.Mounts is set: a build container has none" if mounts else None
    most = policy.max_workspace_mb
    wanted = (
        f"one volume at the working directory, driver local, type=tmpfs, device=tmpfs, "
        f"o=size=<1 to {most}>m,nosuid,nodev (uid=, gid=, mode= allowed; --max-workspace-mb)"
    )
    if len(mounts) != 1:
        return f"HostConfig.Mounts has {len(mounts)} mounts: a sandbox's workspace is {wanted}"
    mount = mounts[0]
    driver = mount.VolumeOptions.DriverConfig if mount.VolumeOptions else None
    options = dict((driver.Options if driver else None) or {})
    if (
        mount.Type != "volume" or mount.Source or mount.ReadOnly
        or mount.Target != body.WorkingDir or not _plain(mount.Target or "")
        or driver is None or driver.Name != "local"
        or options.pop("type", None) != "tmpfs" or options.pop("device", None) != "tmpfs"
    ):  # fmt: skip
        return f"HostConfig.Mounts {_said(mount)}: a sandbox's workspace is {wanted}"
    tokens = options.pop("o", "").split(",")
    sizes = [int(token[5:-1]) for token in tokens if WORKSPACE_SIZE.fullmatch(token)]
    if options or not all(WORKSPACE_OPTION.fullmatch(token) for token in tokens) or not {
        "nosuid", "nodev"
    } <= set(tokens):  # fmt: skip
        return f"HostConfig.Mounts {_said(mount)}: a sandbox's workspace is {wanted}"
    if len(sizes) != 1 or not 0 < sizes[0] <= most:
        size = sizes[0] if len(sizes) == 1 else "none" if not sizes else "several"
        return f"the workspace's size is {size} MB: between 1 and {most} (--max-workspace-mb)"
    return None


def _said(mount: MountSettings) -> str:
    return mount.model_dump_json(exclude_none=True)[:300]


def runtime(policy: GatePolicy, shape: Shape, body: CreateBody, host: HostSettings) -> str | None:
    if shape.runtime(policy) is None and host.Runtime:
        return (
            f"HostConfig.Runtime {host.Runtime!r}: this gate runs containers under dockerd's "
            "default runtime (it was started without --runtime)"
        )
    return None


CREATE_RULES: tuple[Rule, ...] = (
    labelled, image, user, root_file_system, capabilities, security_options, binds, network,
    limits, logs, filesystems, workspace, runtime,
)  # fmt: skip


def create_refusal(policy: GatePolicy, body: CreateBody, *, build_socket: bool) -> str | None:
    """Why `POST /containers/create` with `body` is refused on a socket; None if it is not."""
    labels = body.Labels or {}
    if BUILD_LABEL in labels and labels[BUILD_LABEL] != "1":
        return f"the label {BUILD_LABEL} is {labels[BUILD_LABEL][:20]!r}: 1 or absent"
    shape = BUILD if BUILD_LABEL in labels else SANDBOX
    if shape.build and not build_socket:
        return f"a build container ({BUILD_LABEL}=1) is created only through the build socket"
    if body.HostConfig is None:
        return "it has no HostConfig: every container's settings are checked there"
    for rule in CREATE_RULES:
        reason = rule(policy, shape, body, body.HostConfig)
        if reason is not None:
            return reason
    return None


def create(
    policy: GatePolicy, raw: bytes, *, build_socket: bool, owner: str | None = None
) -> bytes:
    """The create body forwarded for `raw`; `Refused` with the reason otherwise. The container
    is labelled `baton.owner` = `owner` (the process that asked, from its socket's peer
    credentials), whatever `raw` says; without `owner`, it carries no owner label."""
    body = decode(CreateBody, raw)
    reason = create_refusal(policy, body, build_socket=build_socket)
    if reason is not None:
        raise Refused(reason)
    return encode(rebuilt(policy, body, owner=owner))


def rebuilt(policy: GatePolicy, body: CreateBody, *, owner: str | None = None) -> CreateBody:
    """`body`, which passed, in canonical spellings, under the gate's runtime and stamped
    with `owner`."""
    assert body.HostConfig is not None
    host = body.HostConfig
    shape = BUILD if BUILD_LABEL in (body.Labels or {}) else SANDBOX
    added = list(dict.fromkeys(capability(name) for name in host.CapAdd or ()))
    host = host.model_copy(update={
        "CapDrop": ["ALL"],
        "CapAdd": added or None,
        "SecurityOpt": ["no-new-privileges"],
        "Runtime": shape.runtime(policy),
    })  # fmt: skip
    user = canonical_user(body.User or "")
    labels = {name: value for name, value in (body.Labels or {}).items() if name != label.OWNER}
    if owner is not None:
        labels[label.OWNER] = owner
    return body.model_copy(update={
        "HostConfig": host, "NetworkingConfig": None, "User": user, "Labels": labels,
    })  # fmt: skip


# -- execs and commits ------------------------------------------------------------------------


def exec_create(raw: bytes, *, container_user: str, in_build: bool) -> bytes:
    """The exec body forwarded for `raw` in a container running as `container_user` (a build
    container's, through the build socket, when `in_build`); `Refused` otherwise. The user is
    always forwarded explicitly, so that dockerd's default never decides it."""
    body = decode(ExecBody, raw)
    if body.Privileged:
        raise Refused("Privileged is true: commands in a container never are")
    if body.Detach or body.DetachKeys:
        raise Refused("Detach and DetachKeys are set: an exec is started as Baton starts it")
    if not body.Cmd:
        raise Refused("Cmd is empty: an exec runs a command")
    who = body.User or container_user
    reason = user_refusal(who, root=in_build, where="User" if body.User else "the container's User")
    if reason is not None:
        raise Refused(reason)
    forwarded = ExecBody(
        Cmd=body.Cmd, Env=body.Env, User=canonical_user(who), WorkingDir=body.WorkingDir,
        AttachStdin=body.AttachStdin, AttachStdout=body.AttachStdout,
        AttachStderr=body.AttachStderr, Tty=body.Tty,
    )  # fmt: skip
    return encode(forwarded)


def exec_start(raw: bytes) -> bytes:
    """The body of `POST /exec/{id}/start`, decoded and rebuilt."""
    return encode(decode(ExecStartBody, raw))


def commit(raw: bytes) -> bytes:
    """The config of a committed environment image: a non-root user, and none of Baton's
    container labels, which dockerd would otherwise copy from the build container (every
    sandbox from the image would then carry them)."""
    body = decode(CommitBody, raw)
    reason = user_refusal(body.User or "", root=False, where="User")
    if reason is not None:
        raise Refused(reason)
    labels = dict(body.Labels or {})
    kept = sorted(name for name in BATON_LABELS if labels.get(name))
    if kept:
        raise Refused(f"Labels {kept} are set: an image is neither a sandbox nor a build")
    labels.update({name: "" for name in BATON_LABELS})
    return encode(
        body.model_copy(update={"User": canonical_user(body.User or ""), "Labels": labels})
    )

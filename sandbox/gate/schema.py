"""The Docker request bodies the gate forwards, as allowlists of dockerd's own types.

Each model is one Go struct of Docker's API (20.10, `api/types`), cut down to the fields
Baton's two container shapes use (`sandbox.docker._create`, `sandbox.build`'s build container),
its execs and its commits, plus the ones docker-py sends with an empty value. Attribute names
are Docker's spellings, which is what the gate forwards; a `dict` is a Go map (keys kept
exactly), any other nested model a Go struct (keys folded, `decode.GoStruct`). A key outside a
model is refused, at any depth: a setting Docker adds later is not let through unread.

What the values may be is `rules.py`'s business; here they are only typed.
"""

from __future__ import annotations

from sandbox.gate.decode import GoStruct, Int64, Nothing


class LogSettings(GoStruct):
    """`HostConfig.LogConfig` (container.LogConfig)."""

    Type: str | None = None
    Config: dict[str, str] | None = None
    """The log driver's options: a map."""


class DriverSettings(GoStruct):
    """`Mounts[].VolumeOptions.DriverConfig` (mount.Driver)."""

    Name: str | None = None
    Options: dict[str, str] | None = None
    """The volume driver's options: a map."""


class VolumeSettings(GoStruct):
    """`Mounts[].VolumeOptions` (mount.VolumeOptions), without `Labels`."""

    NoCopy: bool | None = None
    DriverConfig: DriverSettings | None = None


class MountSettings(GoStruct):
    """`HostConfig.Mounts[]` (mount.Mount), without `Consistency`, `BindOptions` and
    `TmpfsOptions`: a sandbox's one mount is its workspace volume."""

    Type: str | None = None
    Source: str | None = None
    Target: str | None = None
    ReadOnly: bool | None = None
    VolumeOptions: VolumeSettings | None = None


class HostSettings(GoStruct):
    """`HostConfig` (container.HostConfig with its embedded Resources). Nothing else of it is
    accepted: no Privileged, Devices, PidMode, IpcMode, UsernsMode, PortBindings, …,
    not even with an empty value (docker-py sends none of them)."""

    Binds: list[str] | None = None
    Mounts: list[MountSettings] | None = None
    CapAdd: list[str] | None = None
    CapDrop: list[str] | None = None
    SecurityOpt: list[str] | None = None
    NetworkMode: str | None = None
    ReadonlyRootfs: bool | None = None
    Tmpfs: dict[str, str] | None = None
    Memory: Int64 | None = None
    MemorySwap: Int64 | None = None
    NanoCpus: Int64 | None = None
    PidsLimit: Int64 | None = None
    Init: bool | None = None
    AutoRemove: bool | None = None
    LogConfig: LogSettings | None = None
    Runtime: str | None = None


class CreateBody(GoStruct):
    """`POST /containers/create` (runconfig.ContainerConfigWrapper): container.Config's fields
    at the top level, with `HostConfig` and `NetworkingConfig`. dockerd also reads every
    HostConfig field at the top level (a deprecated embedded HostConfig, used whole when
    `HostConfig` is missing, partly merged into it otherwise): none of them is accepted there."""

    User: str | None = None
    AttachStdin: bool | None = None
    AttachStdout: bool | None = None
    AttachStderr: bool | None = None
    Tty: bool | None = None
    OpenStdin: bool | None = None
    StdinOnce: bool | None = None
    Env: list[str] | None = None
    Cmd: list[str] | None = None
    Image: str | None = None
    Volumes: dict[str, Nothing] | None = None
    WorkingDir: str | None = None
    NetworkDisabled: bool | None = None
    Labels: dict[str, str] | None = None
    HostConfig: HostSettings | None = None
    NetworkingConfig: Nothing | None = None
    """Accepted only empty (docker-py sends it only when asked to join networks)."""


class ExecBody(GoStruct):
    """`POST /containers/{id}/exec` (types.ExecConfig). `Privileged`, `Detach` and
    `DetachKeys` are accepted only with their empty value, and `Container` (which docker-py
    sends and dockerd 20.10 ignores) with any; none of the four is forwarded."""

    Cmd: list[str] | None = None
    Env: list[str] | None = None
    User: str | None = None
    WorkingDir: str | None = None
    AttachStdin: bool | None = None
    AttachStdout: bool | None = None
    AttachStderr: bool | None = None
    Tty: bool | None = None
    Privileged: bool | None = None
    Detach: bool | None = None
    DetachKeys: str | None = None
    Container: str | None = None


class ExecStartBody(GoStruct):
    """`POST /exec/{id}/start` (types.ExecStartCheck)."""

    Detach: bool | None = None
    Tty: bool | None = None


class CommitBody(GoStruct):
    """`POST /commit`: the new image's config. dockerd decodes it as a create body and keeps
    container.Config; of that, only these are accepted (the rest comes from the container)."""

    Env: list[str] | None = None
    User: str | None = None
    WorkingDir: str | None = None
    Cmd: list[str] | None = None
    Labels: dict[str, str] | None = None

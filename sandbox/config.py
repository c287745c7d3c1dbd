"""What a sandbox may use: image, network, limits. Built from the operator's configuration,
never from a tool call, so no model can lift a limit."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

IMAGE_TAG = "baton-sandbox:2"
"""The image `python -m sandbox.image` builds and sandboxes run by default. Bump the number
whenever the image's contents change, so that a stale local image is never mistaken for it."""


class SandboxConfig(BaseModel):
    """One container per stage execution, with these limits. The defaults are the safe ones:
    no network, no swap, a non-root user, bounded processes, memory, CPU, time and output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = IMAGE_TAG
    """The image every sandbox starts from; it must exist locally (nothing is pulled)."""
    network: str | None = None
    """None: no network at all (`network_mode="none"`). A name: that Docker network, an
    explicit opt-in per stage (an egress proxy's network, say). Never `host` or a container's."""
    memory_mb: int = Field(1024, ge=16)
    """Memory limit; swap is set to the same value, so there is no swap."""
    cpus: float = Field(1.0, gt=0)
    """CPU share, in CPUs (`nano_cpus`)."""
    pids_limit: int = Field(256, ge=8)
    """Most processes and threads alive at once; contains fork bombs."""
    tmp_size_mb: int = Field(256, ge=1)
    """Size of the tmpfs at `/tmp` (rw, nosuid, nodev); it counts against `memory_mb`."""
    workspace: str = "/workspace"
    """The writable working directory: a volume of its own, removed with the container, that
    starts with what the image keeps for it (`WORKSPACE_SEED`). The rest of the root file
    system is read-only."""
    workspace_mb: int = Field(512, ge=1)
    """Size of the workspace: a tmpfs (Docker's local volume driver, `type=tmpfs`, nosuid,
    nodev), so a command cannot fill the host's disk through it; a write past it fails with
    "No space left on device". Like `/tmp`, what it holds counts against `memory_mb`. The
    sandbox gate bounds it (`--max-workspace-mb`)."""
    user: str = Field("1000:1000", pattern=r"^\d+:\d+$")
    """`uid:gid` every process in the sandbox runs as; never root."""
    ttl_s: int = Field(1800, ge=1)
    """Dead-man switch: the container ends itself this long after it starts, even if the worker
    that made it died. A stage must finish well within it."""
    exec_timeout_s: float = Field(120.0, gt=0)
    """Wall-clock limit of one command unless the call gives its own."""
    max_output_bytes: int = Field(1_000_000, ge=1)
    """Most output kept per command (stdout and stderr together); the rest is read and dropped."""
    log_max_size: str = Field("1m", pattern=r"^\d+[kmg]?$")
    """Cap of the container's own log (json-file `max-size`)."""
    runtime: str | None = Field(None, pattern=r"^[A-Za-z0-9][\w.-]*$")
    """`BATON_SANDBOX__RUNTIME`: the OCI runtime dockerd runs the container with, by the name
    registered in its `daemon.json` (`runsc` for gVisor); None: the daemon's default, runc.
    The limits above apply under either, but under runsc reaching the memory or pids limit
    ends the whole sandbox, and runsc is registered with `--network=none`, so `network` gives
    no network there (docs/sandboxes.md, "Sandbox hosts")."""

    @field_validator("network")
    @classmethod
    def _no_shared_namespace(cls, value: str | None) -> str | None:
        if value is not None and (value in ("host", "none", "") or value.startswith("container:")):
            raise ValueError(
                "network must be None (no network) or the name of a Docker network; "
                "'host' and 'container:…' would share another network namespace"
            )
        return value

    @field_validator("workspace")
    @classmethod
    def _absolute_workspace(cls, value: str) -> str:
        top = value.split("/")[1] if value.startswith("/") else ""
        if not re.fullmatch(r"(/[\w.-]+)+", value) or top in ("tmp", "proc", "sys", "dev"):
            raise ValueError("workspace must be an absolute path such as /workspace")
        return value

    @field_validator("user")
    @classmethod
    def _not_root(cls, value: str) -> str:
        if value.split(":")[0] == "0":
            raise ValueError("sandboxes never run as root (uid 0)")
        return value

    @property
    def uid_gid(self) -> tuple[int, int]:
        """`user` as numbers."""
        uid, gid = self.user.split(":")
        return int(uid), int(gid)

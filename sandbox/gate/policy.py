"""The gate's options (what it lets through), and who may touch an existing container.

There are two sockets. The ordinary one (`--listen`) is the workers': it creates sandboxes and
acts on them. The build socket (`--build-listen`) is the environment builder's: besides what
the ordinary one does, it alone creates build containers (`baton.build=1`), runs commands as
root in them, unpacks archives into them and commits them into environment images. A label is
only what a container says of itself; which socket a request came through is who asked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandbox import labels as label
from sandbox.build import BUILD_LABEL, CA_PATH, EGRESS_PATH, ENV_REPOSITORY
from sandbox.config import IMAGE_TAG

DEFAULT_IMAGE_PREFIXES = (f"{IMAGE_TAG.partition(':')[0]}:", f"{ENV_REPOSITORY}:")
"""Baton's sandbox image (`baton-sandbox:<n>`) and its environment images (`baton-env:<key>`)."""
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")
"""An image reference by name and tag (no digest: a name is what the prefixes speak of)."""
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
"""What dockerd accepts as a named volume's name (the source of a bind that is not a path)."""
SHARING_NETWORKS = ("host", "default")
"""Network modes no allowed network may be: `host` shares the host's namespace and `default` is
whatever dockerd picks (name the network instead); nor may a `container:` mode, which shares
another container's."""


class GatePolicy(BaseModel):
    """The gate's options that decide what a request may ask (`baton sandbox-gate --help`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_prefixes: tuple[str, ...] = DEFAULT_IMAGE_PREFIXES
    """A container's image must start with one of these, as the caller names it."""
    networks: frozenset[str] = frozenset()
    """Docker networks a sandbox may join besides `none` (`SandboxConfig.network`, an explicit
    opt-in per stage). Build containers have no network: they reach the registries through
    the egress proxy's socket."""
    ca_bundle: str | None = None
    """The host path of the CA bundle a build container may see read-only at `CA_PATH`."""
    egress_source: str | None = None
    """The folder of the egress proxy's socket (a host path, or a Docker volume's name), which
    a build container may see read-only at `EGRESS_PATH`."""
    runtime: str | None = None
    """Set: every sandbox runs under this OCI runtime (`runsc`), whatever the caller asked.
    None: containers run under dockerd's default, and a caller may not name another."""
    build_runtime: str | None = None
    """The runtime of build containers; None: `runtime`. (gVisor reaches a host unix socket,
    the egress proxy's, only when registered with `--host-uds=open`, as Baton registers
    `runsc`.)"""
    max_memory_mb: int = Field(8192, ge=16)
    """Most memory (and memory + swap) a container may have."""
    max_cpus: float = Field(4.0, gt=0)
    """Most CPUs (`NanoCpus` / 1e9) a container may have."""
    max_pids: int = Field(4096, ge=8)
    """Highest `PidsLimit` a container may have."""
    max_workspace_mb: int = Field(4096, ge=1)
    """Largest workspace a sandbox may have (`SandboxConfig.workspace_mb`: a tmpfs volume of
    that size); a sandbox without one is refused."""

    @field_validator("networks")
    @classmethod
    def _no_shared_network(cls, value: frozenset[str]) -> frozenset[str]:
        for name in value:
            if name in SHARING_NETWORKS or name.startswith("container:") or name in ("", "none"):
                raise ValueError(f"--allow-network {name!r}: not a network a sandbox may join")
        return value

    @field_validator("ca_bundle")
    @classmethod
    def _absolute_bundle(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ":" in value):
            raise ValueError(f"--allow-ca-bundle {value!r}: an absolute host path without ':'")
        return value

    @field_validator("egress_source")
    @classmethod
    def _egress_source(cls, value: str | None) -> str | None:
        if value is None or (value.startswith("/") and ":" not in value):
            return value
        if not VOLUME_NAME.fullmatch(value):
            raise ValueError(
                f"--allow-egress-source {value!r}: an absolute host path without ':' "
                "or a Docker volume's name"
            )
        return value

    @property
    def runtime_of_builds(self) -> str | None:
        return self.build_runtime or self.runtime

    def build_binds(self) -> frozenset[str]:
        """The binds a build container may have, exactly as docker-py writes them."""
        binds = set()
        if self.ca_bundle is not None:
            binds.add(f"{self.ca_bundle}:{CA_PATH}:ro")
        if self.egress_source is not None:
            binds.add(f"{self.egress_source}:{EGRESS_PATH}:ro")
        return frozenset(binds)


def is_build(labels: Mapping[str, str]) -> bool:
    return labels.get(BUILD_LABEL) == "1"


def touch_refusal(
    labels: Mapping[str, str], *, build_socket: bool, build_only: bool = False
) -> str | None:
    """Why a request through a socket may not act on a container with `labels`; None if it
    may. `build_only`: the request is a commit, which only a build container may be."""
    if labels.get(label.SANDBOX) != "1":
        return f"the container is not labelled {label.SANDBOX_FILTER}: not a Baton sandbox"
    if is_build(labels) and not build_socket:
        return (
            f"the container is a build container ({BUILD_LABEL}=1): only the build socket "
            "(--build-listen) reaches it"
        )
    if build_only and not is_build(labels):
        return f"the container is not labelled {BUILD_LABEL}=1: only a build is committed"
    return None


def image_refusal(policy: GatePolicy, image: str) -> str | None:
    """Why a container may not start from `image`; None if it may."""
    if not IMAGE.fullmatch(image) or not image.startswith(policy.image_prefixes):
        allowed = ", ".join(f"{prefix}…" for prefix in policy.image_prefixes)
        return f"the image {image[:80]!r} is not one of Baton's ({allowed}; --allow-image-prefix)"
    return None


def not_an_environment(repository: str) -> str | None:
    """Images the gate removes or commits are environments: `baton-env:<key>`."""
    name, _, tag = repository.partition(":")
    if name != ENV_REPOSITORY or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        return f"{repository!r} is not an environment image ({ENV_REPOSITORY}:<key>)"
    return None

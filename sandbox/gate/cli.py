"""`baton sandbox-gate`, added to the `baton` command by entry point (pyproject.toml)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType

import click
from pydantic import ValidationError

from sandbox.gate.decode import reason
from sandbox.gate.policy import DEFAULT_IMAGE_PREFIXES, GatePolicy
from sandbox.gate.proxy import ConnectionLimits
from sandbox.gate.server import serve

logger = logging.getLogger(__name__)
LIMITS = ConnectionLimits()
POLICY = GatePolicy()


@click.command("sandbox-gate")
@click.option(
    "--listen",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The unix socket workers reach (DOCKER_HOST=unix://<it>).",
)
@click.option(
    "--build-listen",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A second socket, the environment builder's: only requests through it "
    "create build containers, run commands as root in them, unpack archives into "
    "them or commit them. Unset: no build goes through this gate.",
)
@click.option(
    "--docker",
    "docker_url",
    default="unix:///var/run/docker.sock",
    show_default=True,
    help="dockerd's own socket.",
)
@click.option(
    "--allow-image-prefix",
    "image_prefixes",
    multiple=True,
    help=f"Images containers may start from (repeatable; default: "
    f"{', '.join(DEFAULT_IMAGE_PREFIXES)}).",
)
@click.option(
    "--allow-network",
    "networks",
    multiple=True,
    help="A Docker network a sandbox may join besides none (repeatable; "
    "SandboxConfig.network). Build containers never have one.",
)
@click.option(
    "--allow-ca-bundle",
    "ca_bundle",
    help="The host CA bundle build containers may bind read-only (BATON_BUILD__CA_BUNDLE).",
)
@click.option(
    "--allow-egress-source",
    "egress_source",
    help="The host folder or Docker volume holding the egress proxy's socket, which "
    "build containers may bind read-only at /run/baton-egress.",
)
@click.option("--runtime", help="Run every container under this OCI runtime (runsc).")
@click.option(
    "--build-runtime", help="Run build containers under this runtime instead (default: --runtime)."
)
@click.option(
    "--max-memory-mb",
    type=int,
    default=POLICY.max_memory_mb,
    show_default=True,
    help="Most memory a container may have.",
)
@click.option(
    "--max-cpus",
    type=float,
    default=POLICY.max_cpus,
    show_default=True,
    help="Most CPUs a container may have.",
)
@click.option(
    "--max-pids",
    type=int,
    default=POLICY.max_pids,
    show_default=True,
    help="Highest pids limit a container may have.",
)
@click.option(
    "--max-workspace-mb",
    type=int,
    default=POLICY.max_workspace_mb,
    show_default=True,
    help="Largest workspace (a tmpfs volume) a sandbox may have; one without a size is refused.",
)
@click.option(
    "--socket-mode",
    default="660",
    show_default=True,
    help="Octal permissions of the --listen socket.",
)
@click.option(
    "--build-socket-mode",
    default="600",
    show_default=True,
    help="Octal permissions of the --build-listen socket.",
)
@click.option(
    "--request-timeout-s",
    type=float,
    default=LIMITS.request_timeout_s,
    show_default=True,
    help="A request's head and JSON body must be whole this long after its first "
    "byte; a streamed body or an answer may stall no longer. Exec streams are "
    "never cut.",
)
@click.option(
    "--idle-timeout-s",
    type=float,
    default=LIMITS.idle_timeout_s,
    show_default=True,
    help="A kept-alive connection with no request this long is closed.",
)
@click.option(
    "--max-connections",
    type=int,
    default=LIMITS.max_connections,
    show_default=True,
    help="Connections served at once on each socket; more wait to be accepted.",
)
def sandbox_gate(  # one parameter per option
    listen: Path,
    build_listen: Path | None,
    docker_url: str,
    image_prefixes: tuple[str, ...],
    networks: tuple[str, ...],
    ca_bundle: str | None,
    egress_source: str | None,
    runtime: str | None,
    build_runtime: str | None,
    max_memory_mb: int,
    max_cpus: float,
    max_pids: int,
    max_workspace_mb: int,
    socket_mode: str,
    build_socket_mode: str,
    request_timeout_s: float,
    idle_timeout_s: float,
    max_connections: int,
) -> None:
    """Serve a Docker API proxy that forwards only what Baton's sandboxes need, so that
    workers never hold dockerd's socket; every refusal is logged."""
    try:
        policy = GatePolicy(
            image_prefixes=image_prefixes or DEFAULT_IMAGE_PREFIXES,
            networks=frozenset(networks),
            ca_bundle=ca_bundle,
            egress_source=egress_source,
            runtime=runtime,
            build_runtime=build_runtime,
            max_memory_mb=max_memory_mb,
            max_cpus=max_cpus,
            max_pids=max_pids,
            max_workspace_mb=max_workspace_mb,
        )
        limits = ConnectionLimits(
            request_timeout_s=request_timeout_s,
            idle_timeout_s=idle_timeout_s,
            max_connections=max_connections,
        )
    except ValidationError as exc:
        raise click.BadParameter(reason(exc)) from None
    logging.getLogger("sandbox.gate").setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        serve(
            policy,
            listen=listen,
            build_listen=build_listen,
            docker_url=docker_url,
            socket_mode=int(socket_mode, 8),
            build_socket_mode=int(build_socket_mode, 8),
            limits=limits,
        )
    except KeyboardInterrupt:
        logger.info("sandbox gate stopped")


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt

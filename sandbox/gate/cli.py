"""`baton sandbox-gate`, added to the `baton` command by entry point (pyproject.toml)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType

import click

from sandbox.gate.policy import DEFAULT_IMAGE_PREFIXES, GatePolicy
from sandbox.gate.proxy import serve

logger = logging.getLogger(__name__)


@click.command("sandbox-gate")
@click.option("--listen", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The unix socket workers reach (DOCKER_HOST=unix://<it>).")  # fmt: skip
@click.option("--docker", "docker_url", default="unix:///var/run/docker.sock", show_default=True,
              help="dockerd's own socket.")  # fmt: skip
@click.option("--allow-image-prefix", "image_prefixes", multiple=True,
              help=f"Images containers may start from (repeatable; default: "
              f"{', '.join(DEFAULT_IMAGE_PREFIXES)}).")  # fmt: skip
@click.option("--allow-network", "networks", multiple=True,
              help="A Docker network containers may join besides none (repeatable): the "
              "build network, BATON_BUILD__NETWORK (bridge by default).")  # fmt: skip
@click.option("--allow-ca-bundle", "ca_bundle", type=click.Path(dir_okay=False),
              help="The host CA bundle build containers may bind read-only "
              "(BATON_BUILD__CA_BUNDLE).")  # fmt: skip
@click.option("--runtime", help="Run every container under this OCI runtime (runsc).")
@click.option("--socket-mode", default="660", show_default=True,
              help="Octal permissions of the listening socket.")  # fmt: skip
def sandbox_gate(
    listen: Path,
    docker_url: str,
    image_prefixes: tuple[str, ...],
    networks: tuple[str, ...],
    ca_bundle: str | None,
    runtime: str | None,
    socket_mode: str,
) -> None:
    """Serve a Docker API proxy that forwards only what Baton's sandboxes need, so that
    workers never hold dockerd's socket; every refusal is logged."""
    policy = GatePolicy(
        image_prefixes=image_prefixes or DEFAULT_IMAGE_PREFIXES,
        networks=frozenset(networks),
        ca_bundle=ca_bundle,
        runtime=runtime,
    )
    logging.getLogger("sandbox.gate").setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        serve(policy, listen=listen, docker_url=docker_url, socket_mode=int(socket_mode, 8))
    except KeyboardInterrupt:
        logger.info("sandbox gate stopped")


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt

"""`reap()`: remove the sandboxes nobody will remove any more.

Three layers keep containers from leaking: `DockerSandbox.start` removes its container when
its block ends; each container ends itself after `ttl_s`; and this reaper, run when a worker
starts and now and then after, removes what is left: containers past `baton.expires`, and
containers whose `baton.owner` is a process of this host that has died. Several processes may
reap at once: a container another reaper removed first is simply skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import docker

from sandbox import labels as label
from sandbox.client import connected, remove, translated

logger = logging.getLogger(__name__)


def reap(client: docker.DockerClient | None = None, *, now: float | None = None) -> list[str]:
    """Remove (force, with volumes) every sandbox container, running or not, that expired or
    whose owner on this host is gone; the ids removed."""
    moment = time.time() if now is None else now
    removed = []
    with connected(client) as docker_client, translated("reaping sandboxes"):
        found = docker_client.api.containers(all=True, filters={"label": label.SANDBOX_FILTER})
        for container in found:
            reason = _why_reap(container.get("Labels") or {}, moment)
            if reason and remove(docker_client, container["Id"]):
                logger.info("reaped sandbox %s: %s", container["Id"][:12], reason)
                removed.append(container["Id"])
    return removed


def _why_reap(labels: dict[str, str], now: float) -> str | None:
    try:
        expires = float(labels.get(label.EXPIRES, "inf"))
    except ValueError:
        expires = float("inf")
    if expires <= now:
        return "expired"
    if label.owner_is_gone(labels.get(label.OWNER, "")):
        return "its owner is gone"
    return None


def remove_labelled(
    labels: Mapping[str, str], client: docker.DockerClient | None = None
) -> list[str]:
    """Remove at once every sandbox carrying all of `labels` (a cancelled stage's, say), or
    named for them (`labels.container_name`: one taken from a warm pool has only its name to
    say whose it is); the ids removed."""
    wanted = [label.SANDBOX_FILTER, *(f"{key}={value}" for key, value in labels.items())]
    pattern = label.name_pattern(labels)
    with connected(client) as docker_client, translated("removing sandboxes"):
        found = docker_client.api.containers(all=True, filters={"label": wanted})
        if pattern is not None:
            named = {"label": label.SANDBOX_FILTER, "name": pattern}
            found += docker_client.api.containers(all=True, filters=named)
        ids = dict.fromkeys(c["Id"] for c in found)
        return [cid for cid in ids if remove(docker_client, cid)]

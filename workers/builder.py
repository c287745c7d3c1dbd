"""Builds handed to the environment builder: the one process per Docker daemon that may create
build containers.

A build runs the repository's own setup (its `setup.py`, its spec's commands): untrusted code
that, unlike a stage's sandbox, needs the package registries. So where a sandbox gate stands
between the workers and dockerd, creating a build container takes the gate's *build* socket,
which only the builder holds (`baton worker --builder`); a code-stage worker holds the ordinary
socket and hands its builds over (`BATON_BUILD__HANDOFF=true`):

    handoff = BuildHandoff(app)                                    # in the worker
    handoff(BuildRequest(repo, commit, spec, key), docker_client)  # a task for the builder

The builder's queue is named after the daemon both of them reach (`build_queue`): with
Compose there is one; in Kubernetes each code-stage pod has its own, and its own builder. The
worker then waits for the environment's record in Redis (`Environments.prepare`), where the
builder writes the image or the failure, as a worker that waited for another one's build lock
always has.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import docker

from sandbox.client import translated
from sandbox.environment import EnvironmentSpec

logger = logging.getLogger(__name__)

BUILD_TASK = "baton.build_environment"
BUILD_QUEUE_PREFIX = "baton.build."


@dataclass(frozen=True)
class BuildRequest:
    """What a builder needs to build an environment a worker is waiting for."""

    repo: str
    commit: str
    spec: EnvironmentSpec | None
    """The run's own spec, or None: the repository's (the builder reads the same tree)."""
    key: str
    """The environment's key, as the worker computed it (the task id carries it)."""


def daemon_id(client: docker.DockerClient) -> str:
    """A short, stable name of the Docker daemon `client` reaches (through a gate or not)."""
    with translated("asking the Docker daemon for its id"):
        info: dict[str, Any] = client.info()
    return hashlib.sha256(str(info["ID"]).encode()).hexdigest()[:12]


def build_queue(client: docker.DockerClient) -> str:
    """The queue of the builder that shares `client`'s daemon."""
    return BUILD_QUEUE_PREFIX + daemon_id(client)


class BuildHandoff:
    """Sends a worker's builds to the builder of its daemon, as Celery tasks (by name)."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def __call__(self, request: BuildRequest, client: docker.DockerClient) -> None:
        """Ask the builder of `client`'s daemon to build `request`."""
        daemon = daemon_id(client)
        spec = request.spec.model_dump_json() if request.spec is not None else None
        self._app.send_task(
            BUILD_TASK,
            args=[request.repo, request.commit, spec, request.key],
            queue=BUILD_QUEUE_PREFIX + daemon,
            task_id=f"build.{request.key}.{daemon}",
        )
        logger.info("environment %s: build handed to the builder of daemon %s", request.key, daemon)

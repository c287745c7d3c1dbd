"""Reaching the Docker daemon, and turning what docker-py raises into `SandboxError`s.

docker-py raises `docker.errors.APIError` for an answer it did not like and lets requests'
exceptions (all `OSError`s: `ConnectionError`, `ReadTimeout`, …) through for a daemon it could
not talk to; `DockerException` covers the rest (no socket at all, say).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import docker
import docker.errors

from sandbox.errors import (
    SandboxError,
    SandboxFileError,
    SandboxStartError,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)

REMOVAL_WAIT_S = 10
"""How long to wait for a removal someone else started (auto-removal, another reaper)."""
BUILD_HINT = (
    "build it with `sudo .venv/bin/python -m sandbox.image` (no registry needed), or with "
    "`docker build -t {image} sandbox/` where Docker Hub is reachable"
)


def connect() -> docker.DockerClient:
    """A client for the daemon named by Docker's usual settings (`DOCKER_HOST`, …)."""
    with translated("connecting to the Docker daemon"):
        return docker.from_env()


@contextmanager
def connected(client: docker.DockerClient | None = None) -> Iterator[docker.DockerClient]:
    """`client` if one is given (left open), else a new connection closed at the end."""
    if client is not None:
        yield client
        return
    own = connect()
    try:
        yield own
    finally:
        own.close()


def remove(client: docker.DockerClient, container_id: str) -> bool:
    """Force-remove a container and its anonymous volumes; True if this call removed it. When
    a removal is already under way (409), wait for it, so that the container is gone on return
    either way. Failures are logged, never raised."""
    try:
        client.api.remove_container(container_id, force=True, v=True)
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            logger.warning("container %s not removed: %s", container_id[:12], exc.explanation)
            return False
    except (docker.errors.DockerException, OSError) as exc:
        logger.warning("container %s not removed: %s", container_id[:12], exc)
        return False
    try:
        client.api.wait(container_id, timeout=REMOVAL_WAIT_S, condition="removed")
    except docker.errors.NotFound:
        pass
    except (docker.errors.DockerException, OSError) as exc:
        logger.warning("container %s still being removed: %s", container_id[:12], exc)
    return False


@contextmanager
def translated(
    operation: str, *, image: str | None = None, path: str | None = None
) -> Iterator[None]:
    """Re-raise Docker's errors from the block as `SandboxError`s whose message starts with
    `operation`. With `image`, a refused request means the sandbox cannot start; with `path`,
    it means the file operation was wrong. Otherwise the daemon or the container failed."""
    try:
        yield
    except SandboxError:
        raise
    except docker.errors.ImageNotFound as exc:
        hint = BUILD_HINT.format(image=image)
        raise SandboxStartError(f"{operation}: the image {image} is not here; {hint}") from exc
    except docker.errors.APIError as exc:
        raise _classified(exc, operation, image=image, path=path) from exc
    except (docker.errors.DockerException, OSError) as exc:
        raise SandboxUnavailableError(
            f"{operation}: the Docker daemon cannot be reached ({exc}); is dockerd running?"
        ) from exc


def _classified(
    exc: docker.errors.APIError, operation: str, *, image: str | None, path: str | None
) -> SandboxError:
    explanation = str(exc.explanation or exc)
    refused = exc.is_client_error()
    if any(gone in explanation for gone in ("No such container", "is not running",
                                             "No such exec instance")):  # fmt: skip
        return SandboxUnavailableError(
            f"{operation}: the sandbox's container is gone ({explanation}); its ttl_s may have "
            "passed, dockerd restarted, or its runtime ended it (gVisor's runsc does when the "
            "memory or pids limit is reached)"
        )
    deterministic = any(words in explanation for words in ("read-only", "invalid symlink",
                                                           "breakout"))  # fmt: skip
    if path is not None and (refused or deterministic):
        return SandboxFileError(f"{operation}: {explanation}")
    if image is not None and refused:
        return SandboxStartError(f"{operation}: Docker refused it ({explanation})")
    return SandboxUnavailableError(f"{operation}: Docker answered {exc.status_code}: {explanation}")

"""`baton-base`: the image Baton's services start from, built without a registry.

Like the sandbox image (`sandbox/image.py`), it is Debian bookworm's minbase made with
debootstrap, slimmed and brought in with `docker import`; it adds what Baton's services need:
python3 and python3-venv (Baton itself goes into a venv, `images/Dockerfile`), git and ripgrep
(the stages' host-side repository work), ca-certificates (Gemini, GitHub), redis-server, and
tini: PID 1 of every container, which reaps the git helpers a killed stage leaves behind
(Kubernetes has no `init: true`).
Redis lives in the same base, rather than in an image of its own, because it costs a few MB
there and the stack then needs one debootstrap, not two; `compose.yaml` runs it as the
`redis` user the package creates.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import docker
import docker.errors

from images.errors import ImageBuildError
from sandbox.errors import SandboxError
from sandbox.image import DEFAULT_MIRROR, RootfsImage, build_rootfs_image, inspected
from sandbox.image import build_lock as sandbox_build_lock

BASE_TAG = "baton-base:2"
"""Bump the version when `BASE` changes: an existing tag is never rebuilt."""


def _add_redis_data_dir(rootfs: Path) -> None:
    """`/data`, owned by the `redis` user the package made: where the official redis image
    keeps its data too, so `compose.yaml` runs Redis from either image alike."""
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        name, _, uid, gid, *_ = line.split(":")
        if name == "redis":
            data = rootfs / "data"
            data.mkdir(mode=0o750, exist_ok=True)
            os.chown(data, int(uid), int(gid))
            return
    raise ImageBuildError("redis-server's package made no `redis` user in the base image")


PACKAGES = ("python3", "python3-venv", "git", "ripgrep", "ca-certificates", "redis-server", "tini")

BASE = RootfsImage(
    packages=PACKAGES,
    changes=(
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["/bin/sh"]',
    ),
    customize=_add_redis_data_dir,
)
LOCK_PATH = Path(tempfile.gettempdir()) / "baton-images.lock"

Progress = Callable[[str], None]


def ensure_base(
    client: docker.DockerClient, say: Progress, *, mirror: str = DEFAULT_MIRROR
) -> bool:
    """Build `BASE_TAG` unless it exists; True when it was built. The caller holds
    `build_lock()`."""
    if image_id(client, BASE_TAG) is not None:
        return False
    try:
        build_rootfs_image(client, BASE_TAG, BASE, mirror=mirror, say=say)
    except SandboxError as exc:
        raise ImageBuildError(f"building {BASE_TAG}: {exc}") from exc
    return True


def image_id(client: docker.DockerClient, tag: str) -> str | None:
    """The id of the image `tag`, or None when there is none."""
    found = inspected(client, tag)
    return None if found is None else str(found["Id"])


def build_lock(say: Progress) -> AbstractContextManager[None]:
    """One build of Baton's images at a time on this host; a second builder waits."""
    return sandbox_build_lock(say, LOCK_PATH)

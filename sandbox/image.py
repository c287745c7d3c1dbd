"""The sandbox image, built without a registry: debootstrap a minimal Debian, slim it, import it.

    sudo .venv/bin/python -m sandbox.image [--tag T] [--mirror URL] [--force]

The image holds Debian bookworm's minbase plus python3 (with venv and pip), git, ripgrep,
ca-certificates, Node.js and npm; a `baton` user and group 1000; and /workspace owned by them.
Where Docker Hub is reachable, `docker build -t baton-sandbox:2 sandbox/` builds the same thing
from `sandbox/Dockerfile`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from sandbox.client import connected, translated
from sandbox.config import IMAGE_TAG
from sandbox.errors import SandboxError, SandboxStartError

logger = logging.getLogger(__name__)

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python3-pip", "git", "ripgrep", "ca-certificates")
"""What every sandbox can run; venv and pip are for building environments (`sandbox.build`),
whose setup commands install a repository's own dependencies."""
APT_PACKAGES = ("nodejs", "npm")
"""Installed with apt-get in the debootstrapped tree: debootstrap's own installer cannot order
npm's few hundred dependencies."""
USER, UID, GID = "baton", 1000, 1000
CHANGES = [
    f"USER {UID}:{GID}",
    "WORKDIR /workspace",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV HOME=/tmp",
    "ENV LANG=C.UTF-8",
    'CMD ["sleep","infinity"]',
]
SLIMMED = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/log",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
)
"""Directories whose contents a read-only sandbox never needs (apt lists and caches, docs,
manual pages, translations); the directories themselves stay."""
LOCK_PATH = Path(tempfile.gettempdir()) / "baton-sandbox-image.lock"
CHUNK_BYTES = 1 << 20
PER_PACKAGE = re.compile(r"I: (Retrieving|Validating) \S+ \S+$|I: \w+ [^ ]+\.\.\.$")
"""debootstrap's one line per package and step: too many to show as progress."""

Progress = Callable[[str], None]

__all__ = ["IMAGE_TAG", "RootfsImage", "build_lock", "build_rootfs_image", "ensure_image"]


def ensure_image(
    tag: str = IMAGE_TAG,
    *,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
) -> bool:
    """Build the image `tag` unless it exists (or `force`); True when it was built. Concurrent
    callers on one host wait for each other: only the first one builds."""
    say = progress or (lambda line: logger.info("%s", line))
    with connected(client) as docker_client:
        if not force and inspected(docker_client, tag) is not None:
            return False
        with build_lock(say):
            if not force and inspected(docker_client, tag) is not None:
                return False
            build_rootfs_image(docker_client, tag, SANDBOX, mirror=mirror, say=say)
            return True


def inspected(client: docker.DockerClient, tag: str) -> dict[str, Any] | None:
    """What Docker knows of the image `tag` (`docker image inspect`), or None if there is none."""
    with translated(f"looking for the image {tag}"):
        try:
            found: dict[str, Any] = client.api.inspect_image(tag)
        except docker.errors.ImageNotFound:
            return None
    return found


@contextmanager
def build_lock(say: Progress, path: Path = LOCK_PATH) -> Iterator[None]:
    """One image build at a time on this host per lock file; a second builder waits."""
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is building an image; waiting for it ({path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class RootfsImage:
    """An image made from a debootstrapped Debian root file system, without a registry."""

    packages: tuple[str, ...]
    """Installed on top of Debian's minbase."""
    changes: tuple[str, ...]
    """Dockerfile instructions `docker import` applies (USER, WORKDIR, ENV, CMD)."""
    customize: Callable[[Path], None] = lambda rootfs: None
    """Last touches to the root file system before it is imported."""
    apt_packages: tuple[str, ...] = ()
    """Installed after debootstrap, with apt-get inside the tree."""


SANDBOX = RootfsImage(PACKAGES, tuple(CHANGES), lambda rootfs: _add_user(rootfs), APT_PACKAGES)


def build_rootfs_image(
    client: docker.DockerClient, tag: str, image: RootfsImage, *, mirror: str, say: Progress
) -> None:
    """Debootstrap, slim, customize and import `image` as `tag`, with progress lines.

    Raises:
        SandboxStartError: not root, no debootstrap, debootstrap or the import failed.
    """
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise SandboxStartError(
            f"the image {tag} is missing and building it needs root and debootstrap "
            "(`apt-get install debootstrap`): run `make setup`, then the build as root"
        )
    started = time.monotonic()
    rootfs = Path(tempfile.mkdtemp(prefix="baton-rootfs-"))
    try:
        _debootstrap(rootfs, image.packages, mirror, say)
        _apt_install(rootfs, image.apt_packages, say)
        _slim(rootfs)
        image.customize(rootfs)
        say(f"importing the root file system as {tag}")
        _import(client, rootfs, tag, image.changes)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    size_mb = client.api.inspect_image(tag)["Size"] / 1e6
    say(f"built {tag} ({size_mb:.0f} MB) in {time.monotonic() - started:.0f} s")


def _debootstrap(rootfs: Path, packages: tuple[str, ...], mirror: str, say: Progress) -> None:
    # debootstrap fakes start-stop-daemon while it installs, so no package starts a service
    # on the host.
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        SUITE,
        str(rootfs),
        mirror,
    ]
    say(" ".join(argv))

    def shown(line: str) -> None:
        if not PER_PACKAGE.match(line):
            say(line)

    returncode, tail = run_streaming(argv, shown)
    if returncode != 0:
        raise SandboxStartError(
            f"debootstrap failed with exit code {returncode} (is {mirror} reachable? "
            "pass --mirror to use another):\n" + "\n".join(tail)
        )


def _apt_install(rootfs: Path, packages: tuple[str, ...], say: Progress) -> None:
    if not packages:
        return
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LANG": "C.UTF-8"}  # fmt: skip
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    for argv in (["apt-get", "update", "-q"], install):
        say(" ".join(argv) + " (in the new tree)")
        returncode, tail = run_streaming(["chroot", str(rootfs), *argv], lambda _: None, env=env)
        if returncode != 0:
            raise SandboxStartError(
                f"{' '.join(argv)} failed with exit code {returncode}:\n" + "\n".join(tail)
            )


def run_streaming(
    argv: list[str], on_line: Progress, *, keep: int = 15, env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """Run a command, handing each line of its output (stdout and stderr) to `on_line` as it
    comes; returns its exit code and its last `keep` lines."""
    tail: deque[str] = deque(maxlen=keep)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        env=env,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            on_line(tail[-1])
    return proc.returncode, list(tail)


def _slim(rootfs: Path) -> None:
    for relative in SLIMMED:
        directory = rootfs / relative
        for entry in directory.glob("*") if directory.is_dir() else ():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _add_user(rootfs: Path) -> None:
    etc = rootfs / "etc"
    entries = {
        "passwd": f"{USER}:x:{UID}:{GID}:Baton sandbox:/tmp:/bin/sh\n",
        "group": f"{USER}:x:{GID}:\n",
        "shadow": f"{USER}:*:19700:0:99999:7:::\n",
        "gshadow": f"{USER}:*::\n",
    }
    for name, line in entries.items():
        path = etc / name
        if path.exists() and f":{UID}:" not in path.read_text():
            with open(path, "a") as file:
                file.write(line)
    workspace = rootfs / "workspace"
    workspace.mkdir(exist_ok=True)
    os.chown(workspace, UID, GID)
    workspace.chmod(0o755)


def _import(client: docker.DockerClient, rootfs: Path, tag: str, changes: tuple[str, ...]) -> None:
    """Stream `tar` of the root file system into the daemon: it is never held in memory."""
    repository, colon, version = tag.rpartition(":")
    if not colon or "/" in version:  # no tag, or the colon was a registry's port
        repository, version = tag, "latest"
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "."], stdout=subprocess.PIPE
    )
    assert tar.stdout is not None
    pipe = tar.stdout

    def chunks() -> Iterator[bytes]:
        while chunk := pipe.read(CHUNK_BYTES):
            yield chunk

    try:
        with translated(f"importing the image {tag}"):
            answer = client.api.import_image_from_data(
                chunks(), repository=repository, tag=version, changes=list(changes)
            )
    finally:
        pipe.close()
        tar.wait()
    last = json.loads(str(answer).strip().splitlines()[-1])
    if tar.returncode != 0 or "error" in last:
        raise SandboxStartError(f"importing {tag} failed: {last.get('error', 'tar failed')}")


def timed_printer() -> Progress:
    """Progress lines for a build command: on stderr, each stamped with the seconds since."""
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    return say


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tag", default=IMAGE_TAG, help=f"default: {IMAGE_TAG}")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"default: {DEFAULT_MIRROR}")
    parser.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    args = parser.parse_args(argv)
    say = timed_printer()
    try:
        built = ensure_image(args.tag, progress=say, mirror=args.mirror, force=args.force)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not built:
        say(f"{args.tag} exists already; --force rebuilds it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

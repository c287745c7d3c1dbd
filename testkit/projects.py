"""Real open-source projects nobody on this team wrote, fetched as their maintainers published
them: source distributions from PyPI (`pip download --no-binary NAME --no-deps`) and packages
from the npm registry (`npm pack`), unpacked, and made into git repositories on demand.

    root = python_sdist("six", "1.16.0", cache)      # the unpacked sdist
    repo = as_git_repo(root, tmp / "six.git")         # a repository Baton can run on

Downloads are kept in `cache`, so a second test session does not fetch them again; test
processes running at once (pytest-xdist) share it, one fetching a project while the others wait
for it (`_claimed`).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import docker

from orchestrator.core.git import COMMITTER
from sandbox.docker import WORKSPACE_SEED

DOWNLOAD_TIMEOUT_S = 300


def python_sdist(name: str, version: str, cache: Path) -> Path:
    """`name==version`'s source distribution from PyPI, unpacked under `cache`; its root."""
    unpacked = cache / f"{name}-{version}"
    with _claimed(unpacked):
        if (unpacked / ".complete").is_file():
            return unpacked
        downloads = cache / "downloads" / unpacked.name
        shutil.rmtree(downloads, ignore_errors=True)
        downloads.mkdir(parents=True)
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", name,
             "--no-deps", "--dest", str(downloads), f"{name}=={version}"],
            capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S,
        )  # fmt: skip
        if fetched.returncode != 0:  # pip's warnings are not worth showing; its errors are
            raise RuntimeError(f"pip download {name}=={version} failed:\n{fetched.stderr[-2000:]}")
        archive = next(
            p
            for p in downloads.iterdir()
            if p.name.lower().replace("_", "-").startswith(f"{name}-{version}".lower())
        )
        _unpack(archive, unpacked)
    return unpacked


def npm_package(name: str, version: str, cache: Path) -> Path:
    """`name@version` from the npm registry (`npm pack`), unpacked under `cache`; its root."""
    unpacked = cache / f"npm-{name}-{version}"
    with _claimed(unpacked):
        if (unpacked / ".complete").is_file():
            return unpacked
        downloads = cache / "downloads" / unpacked.name
        shutil.rmtree(downloads, ignore_errors=True)
        downloads.mkdir(parents=True)
        packed = subprocess.run(
            ["npm", "pack", "--silent", f"{name}@{version}"],
            cwd=downloads, check=True, capture_output=True, text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
        ).stdout.split()[-1]  # fmt: skip
        _unpack(downloads / packed, unpacked)
    return unpacked


def as_git_repo(root: Path, dest: Path) -> Path:
    """A git repository at `dest` holding `root`'s files in one commit."""
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(".complete"), symlinks=True)
    env = {"GIT_AUTHOR_NAME": COMMITTER["user.name"], "GIT_AUTHOR_EMAIL": COMMITTER["user.email"],
           "GIT_COMMITTER_NAME": COMMITTER["user.name"],
           "GIT_COMMITTER_EMAIL": COMMITTER["user.email"], "PATH": "/usr/bin:/bin"}  # fmt: skip
    for argv in (
        ["git", "init", "--quiet", "--initial-branch=main"],
        ["git", "add", "--all", "--force"],
        ["git", "commit", "--quiet", "--no-verify", "-m", f"{root.name} as published"],
    ):
        subprocess.run(argv, cwd=dest, check=True, env=env, timeout=120)
    return dest


def tree_tar(root: Path, *, uid: int = 1000, gid: int = 1000) -> bytes:
    """`root`'s files as a tar owned by `uid:gid` (as a worker copies a tree into a sandbox)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(root.rglob("*")):
            if path.name == ".complete" or ".git" in path.relative_to(root).parts:
                continue
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
            if info.isfile():
                with open(path, "rb") as data:
                    archive.addfile(info, data)
            else:
                archive.addfile(info)
    return buffer.getvalue()


@contextlib.contextmanager
def _claimed(unpacked: Path) -> Iterator[None]:
    """Held while this process fetches and unpacks `unpacked`: a lock file beside it, so
    another process asking for the same project waits, then finds it complete."""
    unpacked.parent.mkdir(parents=True, exist_ok=True)
    with open(unpacked.with_name(unpacked.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unpack(archive: Path, dest: Path) -> None:
    """The archive's single top folder's contents, as `dest`."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as opened:
        opened.extractall(partial, filter="data")
    tops = list(partial.iterdir())
    top = tops[0] if len(tops) == 1 and tops[0].is_dir() else partial
    shutil.rmtree(dest, ignore_errors=True)
    top.rename(dest)
    shutil.rmtree(partial, ignore_errors=True)
    (dest / ".complete").touch()


def summary_counts(output: str) -> tuple[int, int]:
    """(passed, failed) from the runner's own last summary line: pytest's `=== 3 passed, 1
    failed ===`, unittest's `Ran 5 tests` with `FAILED (failures=1, errors=1, skipped=2)`,
    jest's `Tests: 1 failed, 48 passed, 49 total`."""
    ran = re.findall(r"^Ran (\d+) tests?", output, re.MULTILINE)
    if ran:
        status = re.findall(r"^(OK|FAILED)(?: \((.*)\))?$", output, re.MULTILINE)[-1]
        parts = dict(p.strip().split("=") for p in status[1].split(",") if "=" in p)
        failed = int(parts.get("failures", 0)) + int(parts.get("errors", 0))
        skipped = int(parts.get("skipped", 0)) + int(parts.get("expected failures", 0))
        return int(ran[-1]) - failed - skipped, failed
    jest = re.findall(r"^Tests:\s+(.*\d+ total)$", output, re.MULTILINE)
    if jest:
        counted = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed)", jest[-1])}
        return counted.get("passed", 0), counted.get("failed", 0)
    line = [ln for ln in output.splitlines() if re.match(r"^=+ .*\d+ (passed|failed)", ln)][-1]
    found = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?)", line)}
    return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0) + found.get(
        "errors", 0
    )


def by_hand(
    client: docker.DockerClient, tag: str, root: Path, command: str, labels: Mapping[str, str]
) -> str:
    """`command` run in image `tag` as a person would: `docker run` with the image's build
    products (`WORKSPACE_SEED`, if it has one) and then `root`, mounted read-only, copied over
    /workspace first (its `.git` left out), as the sandbox's user, no network; what it
    printed."""
    seed = f"[ ! -d {WORKSPACE_SEED} ] || cp -a {WORKSPACE_SEED}/. /workspace/"
    script = f"{seed} && cp -r /src/. /workspace/ && rm -rf /workspace/.git && cd /workspace && "
    script += command
    output: bytes = client.containers.run(
        tag, ["sh", "-c", script + "; true"], remove=True, network_mode="none",
        volumes={str(root): {"bind": "/src", "mode": "ro"}}, user="1000:1000",
        labels=dict(labels), stderr=True,
    )  # fmt: skip
    return output.decode(errors="replace")

"""The host-side repository cache: one bare mirror per repository, working copies from it.

A stage that works on code gets a fresh working copy of the run's pinned commit. Cloning from
the network for every stage would dominate its run time, so each repository is mirrored once
per host (`git clone --mirror`) and refreshed with `git fetch --prune`; working copies share
the mirror's objects (`git clone --shared`) and cost almost nothing.

Mirrors are changed only under an exclusive `flock` on a lock file beside them, so stages in
threads and in separate worker processes can share one cache directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.errors import RepoError
from orchestrator.git import (
    GIT_TIMEOUT_S,
    NETWORK_TIMEOUT_S,
    git_env,
    redact,
    repo_source,
    run_git,
)
from orchestrator.git import git_for as _git

COMMITTER = {"user.name": "Baton", "user.email": "baton@localhost"}
"""The identity of commits made in working copies."""


class RepoCache:
    """Bare mirrors of the repositories runs work on, under one directory of this host."""

    def __init__(self, root: Path, *, network_timeout_s: float = NETWORK_TIMEOUT_S) -> None:
        self.root = root
        self.network_timeout_s = network_timeout_s

    def mirror_path(self, repo: str) -> Path:
        """Where the mirror of `repo` lives (whether or not it exists yet)."""
        key = hashlib.sha256(repo_source(repo).encode()).hexdigest()[:16]
        return self.root / f"{key}.git"

    def mirror(self, repo: str) -> Path:
        """Clone `repo` as a bare mirror, or refresh its mirror; returns the mirror's path."""
        source, path = repo_source(repo), self.mirror_path(repo)
        with self._locked(path):
            self._sync(source, path, refresh=True)
        return path

    def checkout(self, repo: str, commit: str, dest: Path) -> Path:
        """A working copy of `commit` in `dest` (absent or empty), detached at that commit.

        Its `origin` is the original repository, so `git push origin` publishes there, and it
        has a committer identity of its own. Its objects live in the mirror: delete the
        working copy before the cache, never the other way round.
        """
        source, path = repo_source(repo), self.mirror_path(repo)
        with self._locked(path):
            self._ensure_commit(source, path, commit)
            clone = ["clone", "--quiet", "--no-checkout", "--shared", str(path), str(dest)]
            _git(source, clone, GIT_TIMEOUT_S)
        in_dest = ["-C", str(dest)]
        _git(source, [*in_dest, "remote", "set-url", "origin", source], GIT_TIMEOUT_S)
        for key, value in COMMITTER.items():
            _git(source, [*in_dest, "config", key, value], GIT_TIMEOUT_S)
        _git(source, [*in_dest, "checkout", "--quiet", "--detach", commit], GIT_TIMEOUT_S)
        return dest

    def archive(self, repo: str, commit: str, *, uid: int, gid: int) -> bytes:
        """The tree of `commit` as a tar whose files belong to `uid:gid` (a sandbox's user).

        Raises:
            RepoError: the commit cannot be found or archived.
        """
        source, path = repo_source(repo), self.mirror_path(repo)
        with self._locked(path):
            self._ensure_commit(source, path, commit)
        done = subprocess.run(
            ["git", "-C", str(path), "archive", "--format=tar", commit],
            env=git_env(), capture_output=True, timeout=self.network_timeout_s, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace").strip()[-500:]
            raise RepoError(f"git archive of {redact(source)} at {commit} failed: {message}")
        return _owned_by(done.stdout, uid, gid)

    @contextmanager
    def _locked(self, mirror: Path) -> Iterator[None]:
        """Hold the mirror's lock: an exclusive `flock`, per open file, so threads wait too."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(mirror.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def _ensure_commit(self, source: str, path: Path, commit: str) -> None:
        """The mirror exists and has `commit`, fetched if it was missing (under the lock).

        Raises:
            RepoError: not even the origin has it.
        """
        self._sync(source, path, refresh=False)
        if not _has_commit(path, commit):
            self._sync(source, path, refresh=True)
        if not _has_commit(path, commit):
            raise RepoError(
                f"commit {commit!r} is not in {redact(source)}, even after a fetch; "
                "check the commit and that it was pushed"
            )

    def _sync(self, source: str, path: Path, *, refresh: bool) -> None:
        """Clone the mirror if it is missing (atomically, via a rename); fetch if `refresh`."""
        if (path / "HEAD").is_file():
            if refresh:
                fetch = ["-C", str(path), "fetch", "--quiet", "--prune", "origin"]
                _git(source, fetch, self.network_timeout_s)
            return
        partial = path.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)  # left by a clone that died half-way
        clone = ["clone", "--quiet", "--mirror", source, str(partial)]
        _git(source, clone, self.network_timeout_s)
        # Working copies borrow the mirror's objects: gc must never prune one of them.
        _git(source, ["-C", str(partial), "config", "gc.auto", "0"], GIT_TIMEOUT_S)
        partial.rename(path)


def _has_commit(mirror: Path, commit: str) -> bool:
    result = run_git(["-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"])
    return result.returncode == 0


def _owned_by(tar_bytes: bytes, uid: int, gid: int) -> bytes:
    """The same archive with every entry owned by `uid:gid`."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source:
            member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
            data = source.extractfile(member) if member.isfile() else None
            target.addfile(member, data)
    return out.getvalue()

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
import posixpath
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from orchestrator.core.errors import RepoError
from orchestrator.core.git import (
    COMMITTER,
    NETWORK_GIT_TIMEOUT_S,
    git_output,
    git_output_bytes,
    redact,
    repo_source,
    run_git,
)

UNCHANGED_MTIME = 946_684_800
"""2000-01-01: the date of a file laid over build products that is as it was when they were
built, so that it is older than they are (some tools refuse dates before 1980)."""


class RepoCache:
    """Bare mirrors of the repositories runs work on, under one directory of this host.

    `network_timeout_s` limits each clone and fetch, and each archive (a large tree is as slow
    to pack as to fetch).
    """

    def __init__(self, root: Path, *, network_timeout_s: float = NETWORK_GIT_TIMEOUT_S) -> None:
        self.root = root
        self.network_timeout_s = network_timeout_s

    def mirror_path(self, repo: str) -> Path:
        """Where the mirror of `repo` lives (whether or not it exists yet)."""
        return self.root / f"{repo_key(repo)}.git"

    def objects(self, repo: str) -> Path:
        """The object folder of `repo`'s mirror, for a repository made on this host to borrow
        from (`workers.baseline`)."""
        return self.mirror_path(repo) / "objects"

    def mirror(self, repo: str) -> Path:
        """Clone `repo` as a bare mirror, or refresh its mirror; returns the mirror's path."""
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            self._sync(source, mirror, refresh=True)
        return mirror

    def checkout(self, repo: str, commit: str, dest: Path) -> Path:
        """A working copy of `commit` in `dest` (absent or empty), detached at that commit.

        Its `origin` is the original repository, so `git push origin` publishes there, and it
        commits as Baton (`COMMITTER`). Its objects live in the mirror: delete the working copy
        before the cache, never the other way round.
        """
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            self._ensure_commit(source, mirror, commit)
            clone = ["clone", "--quiet", "--no-checkout", "--shared", str(mirror), str(dest)]
            git_output(source, clone)
        in_dest = ["-C", str(dest)]
        git_output(source, [*in_dest, "remote", "set-url", "origin", source])
        for key, value in COMMITTER.items():
            git_output(source, [*in_dest, "config", key, value])
        git_output(source, [*in_dest, "checkout", "--quiet", "--detach", commit])
        return dest

    def archive(
        self, repo: str, commit: str, *, uid: int, gid: int, over: str | None = None
    ) -> bytes:
        """The tree of `commit` as a tar whose files belong to `uid:gid` (a sandbox's user).

        `over`: the commit whose build products the tree is laid over (an environment image's,
        `sandbox.build`). Then a file that differs from `over`'s is dated now and every other
        one `UNCHANGED_MTIME`, so that `make` and setuptools, which compare times, see exactly
        the changed sources as newer than the products built from `over`'s; all of them are
        dated now when `over` cannot be found.

        Raises:
            RepoError: the commit cannot be found or archived.
        """
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            self._ensure_commit(source, mirror, commit)
        tar = git_output_bytes(
            source,
            ["-C", str(mirror), "archive", "--format=tar", commit],
            timeout_s=self.network_timeout_s,
            failed=f"git archive of {redact(source)} at {commit} failed",
        )
        if over is None:
            return _owned_by(tar, uid, gid)
        changed = self.changed(repo, over, commit)
        now = int(time.time())

        def dated(name: str) -> int:
            return now if changed is None or name in changed else UNCHANGED_MTIME

        return _owned_by(tar, uid, gid, mtime=dated)

    def changed(
        self, repo: str, base: str, head: str, pathspecs: Sequence[str] = ()
    ) -> frozenset[str] | None:
        """The paths (those `pathspecs` match, if any are given) that differ between the trees
        of `base` and `head` (added, removed or changed; a rename is both its paths); None when
        `base` is not in the repository any more (a rewritten history): then nothing can be said
        to be unchanged."""
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            self._ensure_commit(source, mirror, head)
            if not _has_commit(mirror, base):
                return None
        args = [
            "-C",
            str(mirror),
            "diff",
            "--name-only",
            "-z",
            "--no-renames",
            base,
            head,
            "--",
            *pathspecs,
        ]
        names = git_output_bytes(source, args, failed=f"git diff of {redact(source)} failed")
        return frozenset(
            name.decode(errors="surrogateescape") for name in names.split(b"\0") if name
        )

    def version(self, repo: str, commit: str) -> str | None:
        """The release `commit` is, or follows: its nearest tag that reads as a version
        (`v1.6.0` and `1.6.0` are 1.6.0), as setuptools-scm would start from; None without
        one. A build reads it where the tree, without `.git`, cannot say
        (`sandbox.detection`)."""
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            self._ensure_commit(source, mirror, commit)
        found = run_git(["-C", str(mirror), "describe", "--tags", "--abbrev=0",
                         "--match", "*[0-9]*", commit])  # fmt: skip
        return release_version(found.stdout.decode(errors="replace").strip())

    def diff(self, repo: str, base: str, head: str) -> str:
        """The change from `base` to `head` as a unified diff, the way a pull request shows it:
        from their merge base (`git diff base...head`), renames found, no external diff or
        text conversion driver run.

        Raises:
            RepoError: either commit cannot be found, or they share no history.
        """
        source, mirror = repo_source(repo), self.mirror_path(repo)
        with self._locked(mirror):
            for commit in (base, head):
                self._ensure_commit(source, mirror, commit)
        args = ["-C", str(mirror), "diff", "--no-color", "--no-ext-diff", "--no-textconv",
                "--find-renames", f"{base}...{head}", "--"]  # fmt: skip
        failed = f"git diff of {redact(source)} from {base[:12]} to {head[:12]} failed"
        return git_output_bytes(source, args, failed=failed).decode(errors="replace")

    @contextmanager
    def _locked(self, mirror: Path) -> Iterator[None]:
        """Hold the mirror's lock: an exclusive `flock`, per open file, so threads wait too."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(mirror.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def _ensure_commit(self, source: str, mirror: Path, commit: str) -> None:
        """The mirror exists and has `commit`, fetched if it was missing (under the lock).

        Raises:
            RepoError: not even the origin has it.
        """
        self._sync(source, mirror, refresh=False)
        if not _has_commit(mirror, commit):
            self._sync(source, mirror, refresh=True)
        if not _has_commit(mirror, commit):
            raise RepoError(
                f"commit {commit!r} is not in {redact(source)}, even after a fetch; "
                "check the commit and that it was pushed"
            )

    def _sync(self, source: str, mirror: Path, *, refresh: bool) -> None:
        """Clone the mirror if it is missing (atomically, via a rename); fetch if `refresh`."""
        if (mirror / "HEAD").is_file():
            if refresh:
                fetch = ["-C", str(mirror), "fetch", "--quiet", "--prune", "origin"]
                git_output(source, fetch, timeout_s=self.network_timeout_s)
            return
        partial = mirror.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)  # left by a clone that died half-way
        clone = ["clone", "--quiet", "--mirror", source, str(partial)]
        git_output(source, clone, timeout_s=self.network_timeout_s)
        # Working copies borrow the mirror's objects: gc must never prune one of them.
        git_output(source, ["-C", str(partial), "config", "gc.auto", "0"])
        partial.rename(mirror)


def release_version(tag: str) -> str | None:
    """The version a release tag names, in its normal form (`v1.6.0` and `1.6.0` name 1.6.0);
    None when it names none (`nightly`)."""
    try:
        return str(Version(tag.removeprefix("v").removeprefix("V")))
    except InvalidVersion:
        return None


def repo_key(repo: str) -> str:
    """A short name for a repository, the same for every way of writing it (a relative path,
    the absolute one): its mirror's, and the prefix of its environments' lookups."""
    return hashlib.sha256(repo_source(repo).encode()).hexdigest()[:16]


def _has_commit(mirror: Path, commit: str) -> bool:
    result = run_git(["-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"])
    return result.returncode == 0


def _owned_by(
    tar_bytes: bytes, uid: int, gid: int, *, mtime: Callable[[str], int] | None = None
) -> bytes:
    """The same archive with every entry owned by `uid:gid` (and dated `mtime(name)`, if
    given), and every symlink that leads out of the tree (`shared -> ..`, `/etc`) replaced by
    a small file saying what it was: Docker refuses to unpack the first kind, and the second
    would show the sandbox's own files."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source:
            member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
            if mtime is not None:
                member.mtime = mtime(member.name.removesuffix("/"))
            if member.issym() and _leaves_tree(member.name, member.linkname):
                marker = OUTSIDE_LINK.format(target=member.linkname).encode()
                member.type, member.linkname, member.size = tarfile.REGTYPE, "", len(marker)
                member.mode = 0o444
                target.addfile(member, io.BytesIO(marker))
                continue
            data = source.extractfile(member) if member.isfile() else None
            target.addfile(member, data)
    return out.getvalue()


def unpack_tree(tree: bytes, dest: Path) -> None:
    """Unpack `tree` (an archive `RepoCache.archive` made: files, folders, links that stay
    inside it) under `dest`. Python's `data` filter checks every member where Python has it
    (from 3.11.4); on Debian bookworm's 3.11.2, in the service image, the same is checked here:
    no absolute path, no `..`, no link that leads out."""
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
            return
        members = archive.getmembers()
        for member in members:
            parts = PurePosixPath(member.name).parts
            outside = member.issym() and _leaves_tree(member.name, member.linkname)
            if member.name.startswith("/") or ".." in parts or outside or member.islnk():
                raise RepoError(f"the repository's tree holds an entry {member.name!r} it may not")
        archive.extractall(dest, members=members)


OUTSIDE_LINK = (
    "[baton] This was a symbolic link to {target!r}, which leads outside the repository; "
    "sandboxes hold only the repository's own files, so its target is not here.\n"
)
"""What a symlink out of the tree becomes in a sandbox (the tools' `read_file` shows it)."""


def _leaves_tree(name: str, target: str) -> bool:
    if posixpath.isabs(target):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved == ".." or resolved.startswith("../")

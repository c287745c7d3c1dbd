"""The git repository a sandbox's workspace starts with, made on the host and shipped in.

Every diff a code stage takes is against a baseline: a commit of exactly the files the workspace
was given. Committing them inside a gVisor sandbox read and hashed every file through its
gofer, in each of a run's seven sandboxes: most of a run's copy-in, and more than its test runs
for a project of a few hundred files (`bench/anatomy.py`). Here git does the same work natively,
in a temporary folder, and the finished `.git` goes into the sandbox in the same archive as the
tree:

* the same commit as before: everything in the tree that `.gitignore`, the test by-products and
  the hidden build products do not match, plus the tracked paths that are added whatever ignores
  them; committed by Baton with a fixed date, without hooks;
* its objects in one pack, borrowed from the host's mirror while it is made (the pack holds
  them all, and the sandbox's repository has no link back);
* an index whose file sizes and modification times are the archive's, and a configuration that
  has git compare only those (`core.checkStat = minimal`), so git in the sandbox trusts the
  index instead of hashing every file again. A file written there gets a new time and is seen;
  one whose size and time were both set back to the archive's is not, which gives nothing away:
  the diff is the only way a change leaves a sandbox, and a change the diff does not show is
  simply not made.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from orchestrator.core.git import COMMITTER, git_output
from workers.mirrors import unpack_tree

GIT_DIR = PurePosixPath(".git")
BRANCH = "master"
"""The baseline's branch (what `git init` names it in the sandbox image's git)."""
BASELINE_DATE = "946684800 +0000"
"""The baseline commit's date (2000-01-01): fixed, so the same tree gives the same commit."""
ISOLATED = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
"""No configuration of the host's user or system (an excludes file, line-ending conversion)
changes what the baseline holds: it is what git in the sandbox, which has none, would commit."""
CONFIG = (
    "[core]\n"
    "\trepositoryformatversion = 0\n"
    "\tfilemode = true\n"
    "\tbare = false\n"
    "\tcheckStat = minimal\n"
    "\ttrustctime = false\n"
)
"""The sandbox repository's configuration: nothing of the host's (no worktree path, no
alternates), and only size and time compared against the index."""


class Baselines:
    """The baselines this process made last, kept by what they were made from. A run's stages
    open its commit again and again (seven sandboxes a fixer run), and a baseline's index is
    only a cache of file sizes and times: one made for an earlier opening of the same commit
    serves a later one, whose files dated differently (the changed sources, dated at each
    opening) are hashed again in the sandbox, nothing more."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._made: OrderedDict[tuple[object, ...], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def with_baseline(
        self,
        tree: bytes,
        *,
        commit: str,
        ignored: Sequence[str] = (),
        tracked: Sequence[str] = (),
        objects: Path | None = None,
        uid: int,
        gid: int,
    ) -> bytes:
        """`with_baseline` of `tree`, the archive of `commit`; the baseline made once."""
        key = (str(objects), commit, tuple(ignored), tuple(tracked), uid, gid)
        with self._lock:
            made = self._made.get(key)
            if made is not None:
                self._made.move_to_end(key)
        if made is None:
            made = baseline(
                tree, ignored=ignored, tracked=tracked, objects=objects, uid=uid, gid=gid
            )
            with self._lock:
                self._made[key] = made
                while len(self._made) > self.keep:
                    self._made.popitem(last=False)
        return beside(tree, made)


def with_baseline(
    tree: bytes,
    *,
    ignored: Sequence[str] = (),
    tracked: Sequence[str] = (),
    objects: Path | None = None,
    uid: int,
    gid: int,
) -> bytes:
    """`tree` (an archive of a repository's files, dated as the sandbox will see them) with a
    `.git` beside them whose `HEAD` commits those files: all but what `ignored` (`.gitignore`
    lines) matches, and the `tracked` paths whatever ignores them. Its entries belong to
    `uid:gid`. `objects`: an object folder that already holds most of the files' blobs (the
    mirror's), read while the pack is made.

    Raises:
        RepoError: git could not make the baseline.
    """
    made = baseline(tree, ignored=ignored, tracked=tracked, objects=objects, uid=uid, gid=gid)
    return beside(tree, made)


def baseline(
    tree: bytes,
    *,
    ignored: Sequence[str],
    tracked: Sequence[str],
    objects: Path | None,
    uid: int,
    gid: int,
) -> bytes:
    """An archive of only the `.git` that `with_baseline` puts beside `tree`."""
    with tempfile.TemporaryDirectory(prefix="baton-baseline-") as folder:
        work, git_dir = Path(folder) / "tree", Path(folder) / "git"
        unpack_tree(tree, work)
        _commit(work, git_dir, ignored, tracked, objects)
        (git_dir / "config").write_text(CONFIG)
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for path in [git_dir, *sorted(git_dir.rglob("*"))]:
                member = archive.gettarinfo(path, str(GIT_DIR / path.relative_to(git_dir)))
                member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
                if member.isfile():
                    with path.open("rb") as data:
                        archive.addfile(member, data)
                else:
                    archive.addfile(member)
        return out.getvalue()


def beside(tree: bytes, extra: bytes) -> bytes:
    """One archive of `tree`'s entries and then `extra`'s."""
    out = io.BytesIO(tree)
    with (
        tarfile.open(fileobj=io.BytesIO(extra)) as source,
        tarfile.open(fileobj=out, mode="a") as target,
    ):
        for member in source:
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def _commit(
    work: Path,
    git_dir: Path,
    ignored: Sequence[str],
    tracked: Sequence[str],
    objects: Path | None,
) -> None:
    """Commit `work` in a repository at `git_dir` (kept apart, so nothing in the tree can be
    taken for git's own files), then pack every object it needs into it."""
    where = "the workspace's baseline"

    def git(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> str:
        command = ["-C", str(work), "--git-dir", str(git_dir), "--work-tree", str(work), *args]
        failed = f"{where} failed (git {args[0]})"
        env = {**ISOLATED, **(env or {})}
        return git_output(where, command, stdin=stdin, config=COMMITTER, env=env, failed=failed)

    git("init", "--quiet", "--template=", f"--initial-branch={BRANCH}")
    info = git_dir / "info"
    info.mkdir(exist_ok=True)
    (info / "exclude").write_text("".join(f"{pattern}\n" for pattern in ignored))
    if objects is not None:
        (git_dir / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (git_dir / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    git("add", "--all")
    if tracked:
        listed = b"".join(p.encode(errors="surrogateescape") + b"\0" for p in tracked)
        git("--literal-pathspecs", "add", "--force", "--pathspec-file-nul",
            "--pathspec-from-file=-", stdin=listed)  # fmt: skip
    # write-tree and commit-tree, not `git commit`: no hook of any configuration runs.
    dated = {"GIT_AUTHOR_DATE": BASELINE_DATE, "GIT_COMMITTER_DATE": BASELINE_DATE}
    commit = git("commit-tree", "-m", "baseline", git("write-tree"), env=dated)
    git("update-ref", "HEAD", commit)
    # Every object into one pack, the borrowed ones too; no delta search (it would cost more
    # time than the smaller pack saves).
    git("repack", "-a", "-d", "-q", "--window=0")
    if objects is not None:
        (git_dir / "objects" / "info" / "alternates").unlink()

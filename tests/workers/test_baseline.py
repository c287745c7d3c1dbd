"""The baseline a sandbox's workspace starts with, made on this host (`workers.baseline`).

Each test lays the archive as Docker does (files with their archived times, the sandbox user's)
and checks the repository with git the test runs itself: it must hold what committing the
same files in place, the way sandboxes did before, holds, and git must see every later edit.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.build import tree_paths
from tests.repos import Git, Upstream
from workers import baseline
from workers.baseline import with_baseline
from workers.mirrors import RepoCache
from workers.rebuild import excluded

FILES = {
    "app.py": "TOTAL = 1\n",
    "pkg/__init__.py": "",
    "build/generated.py": "# tracked, under an ignored and hidden folder\n",
    "keep.log": "tracked, yet ignored by .gitignore\n",
    ".gitattributes": "VERSION export-subst\n",
    "VERSION": "$Format:%H$\n",
}
IGNORES = "*.log\nbuild/\n"
"""The repository's .gitignore, committed after the files it matches (which stay tracked)."""
PRODUCTS = ["build/", "pkg/_speedups.so"]


@pytest.fixture
def laid(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> Callable[..., tuple[Path, Upstream, str]]:
    """A workspace laid from an upstream commit of `FILES` (and links), as `DockerSandboxes`
    does: the archive with its baseline, unpacked."""

    def lay(*, with_objects: bool = True, home: Path | None = None) -> tuple[Path, Upstream, str]:
        upstream = make_upstream()
        upstream.commit(FILES)
        upstream.commit({".gitignore": IGNORES})
        (upstream.work / "run.sh").write_text("#!/bin/sh\necho ok\n")
        (upstream.work / "run.sh").chmod(0o755)
        (upstream.work / "alias.py").symlink_to("app.py")
        (upstream.work / "outside").symlink_to("/etc/passwd")
        commit = upstream.commit({}, "links")
        cache = RepoCache(tmp_path / "mirrors")
        tree = cache.archive(str(upstream.bare), commit, uid=os.getuid(), gid=os.getgid())
        ignored, forced = excluded(PRODUCTS, tree_paths(tree))
        with pytest.MonkeyPatch.context() as patch:
            if home is not None:  # the host user's own git configuration
                patch.setenv("HOME", str(home))
            data = with_baseline(
                tree, ignored=["__pycache__/", *ignored], tracked=forced,
                objects=cache.objects(str(upstream.bare)) if with_objects else None,
                uid=os.getuid(), gid=os.getgid(),
            )  # fmt: skip
        root = tmp_path / "workspace"
        root.mkdir()
        subprocess.run(["tar", "-xf", "-", "-C", root], input=data, check=True)
        return root, upstream, commit

    return lay


def test_the_baseline_holds_what_committing_the_files_in_place_would(
    laid: Callable[..., tuple[Path, Upstream, str]], git: Git, tmp_path: Path
) -> None:
    root, _, _ = laid()
    # The way sandboxes made it before: git in the workspace itself, the same exclude file.
    by_hand = tmp_path / "by-hand"
    subprocess.run(["cp", "-a", root, by_hand], check=True)
    subprocess.run(["rm", "-rf", by_hand / ".git"], check=True)
    git("init", "-q", cwd=by_hand)
    (by_hand / ".git" / "info" / "exclude").write_text(
        (root / ".git" / "info" / "exclude").read_text()
    )
    git("add", "--all", cwd=by_hand)
    git("add", "--force", "build/generated.py", cwd=by_hand)

    assert git("ls-files", "-s", cwd=root) == git("ls-files", "-s", cwd=by_hand)
    listed = git("ls-files", cwd=root).splitlines()
    assert "keep.log" not in listed  # its own .gitignore, as git add --all does
    assert {"build/generated.py", "run.sh", "alias.py", "outside", "VERSION"} <= set(listed)
    assert git("status", "--porcelain", cwd=root) == ""
    assert git("log", "--format=%an <%ae>|%ad|%s", "--date=unix", cwd=root) == (
        "Baton <baton@localhost>|946684800|baseline"
    )


def test_the_baseline_stands_alone_and_borrows_nothing_from_the_host(
    laid: Callable[..., tuple[Path, Upstream, str]], git: Git
) -> None:
    root, _, _ = laid()

    assert not (root / ".git" / "objects" / "info" / "alternates").exists()
    git("fsck", "--full", "--no-dangling", cwd=root)
    config = (root / ".git" / "config").read_text()
    assert "worktree" not in config and str(root.parent) not in config
    assert {p.stat().st_uid for p in (root / ".git").rglob("*")} == {os.getuid()}


@pytest.mark.parametrize("with_objects", [True, False], ids=["mirror's objects", "none"])
def test_every_edit_shows_in_the_diff_even_one_of_the_same_size(
    laid: Callable[..., tuple[Path, Upstream, str]], git: Git, with_objects: bool
) -> None:
    root, _, _ = laid(with_objects=with_objects)

    (root / "app.py").write_text("TOTAL = 2\n")  # the same size, written now
    (root / "pkg" / "new.py").write_text("x = 1\n")
    (root / "run.sh").chmod(0o644)
    (root / "pkg" / "_speedups.so").write_bytes(b"\x7fELF product")
    (root / "build" / "extra.o").write_bytes(b"a new file in a hidden folder")
    git("add", "--intent-to-add", "--all", cwd=root)

    changed = git("diff", "--name-status", cwd=root).splitlines()
    assert sorted(changed) == ["A\tpkg/new.py", "M\tapp.py", "M\trun.sh"]


def test_the_hosts_own_git_configuration_changes_nothing(
    laid: Callable[..., tuple[Path, Upstream, str]],
    git: Git,
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "ignore").write_text("*.py\n")
    (home / ".gitconfig").write_text(f"[core]\n\texcludesFile = {home / 'ignore'}\n")

    root, _, _ = laid(home=home)

    assert {"app.py", "alias.py"} <= set(git("ls-files", cwd=root).splitlines())


def redated(tree: bytes, name: str, mtime: int) -> bytes:
    """`tree` with `name` dated `mtime`, as a later opening of the same commit dates it."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tree)) as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source:
            if member.name == name:
                member.mtime = mtime
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def test_a_later_opening_of_the_same_commit_reuses_the_baseline_and_its_redated_files_are_no_change(
    make_upstream: Callable[[], Upstream],
    git: Git,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"app.py": "TOTAL = 1\n", "lib.py": "x = 1\n"})
    cache = RepoCache(tmp_path / "mirrors")
    first = cache.archive(str(upstream.bare), commit, uid=os.getuid(), gid=os.getgid())
    later = redated(first, "app.py", 2_000_000_000)  # the file changed since the image's commit
    made: list[bytes] = []
    real = baseline.baseline

    def counted(tree: bytes, **how: Any) -> bytes:
        made.append(tree)
        return real(tree, **how)

    monkeypatch.setattr(baseline, "baseline", counted)
    baselines = baseline.Baselines()
    how = {"commit": commit, "objects": cache.objects(str(upstream.bare)),
           "uid": os.getuid(), "gid": os.getgid()}  # fmt: skip

    baselines.with_baseline(first, **how)
    laid = baselines.with_baseline(later, **how)

    assert made == [first]  # made once
    root = tmp_path / "workspace"
    root.mkdir()
    subprocess.run(["tar", "-xf", "-", "-C", root], input=laid, check=True)
    assert (root / "app.py").stat().st_mtime == 2_000_000_000
    assert git("status", "--porcelain", cwd=root) == ""
    (root / "lib.py").write_text("x = 2\n")
    assert git("diff", "--name-only", cwd=root) == "lib.py"

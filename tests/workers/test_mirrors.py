"""The repository cache against real git: mirrors, working copies, concurrency, commits."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.core.errors import RepoError
from tests.repos import Git, Upstream
from workers.mirrors import RepoCache, unpack_tree


@pytest.fixture
def cache(tmp_path: Path) -> RepoCache:
    return RepoCache(tmp_path / "cache")


def test_mirror_is_cloned_once_then_refreshed_so_a_new_commit_can_be_checked_out(
    make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path, git: Git
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    mirror = cache.mirror(str(upstream.bare))
    marker = mirror / "made-by-the-first-clone"
    marker.touch()
    second = upstream.commit({"a.txt": "two\n"})

    assert cache.mirror(str(upstream.bare)) == mirror
    assert marker.exists(), "the mirror was cloned again instead of fetched"
    assert git("rev-parse", "refs/heads/main", cwd=mirror) == second
    copy = cache.checkout(str(upstream.bare), second, tmp_path / "copy")
    assert (copy / "a.txt").read_text() == "two\n"


def test_checkout_fetches_a_commit_the_mirror_does_not_have_yet(
    make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    cache.mirror(str(upstream.bare))
    newer = upstream.commit({"a.txt": "newer\n"})

    copy = cache.checkout(str(upstream.bare), newer, tmp_path / "copy")

    assert (copy / "a.txt").read_text() == "newer\n"


def test_checkout_is_detached_at_a_pinned_older_commit(
    make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path, git: Git
) -> None:
    upstream = make_upstream()
    older = upstream.commit({"a.txt": "one\n"})
    upstream.commit({"a.txt": "two\n", "b.txt": "new\n"})

    copy = cache.checkout(str(upstream.bare), older, tmp_path / "copy")

    assert git("rev-parse", "HEAD", cwd=copy) == older
    on_a_branch = git.run("symbolic-ref", "--quiet", "HEAD", cwd=copy, check=False)
    assert on_a_branch.returncode == 1, "HEAD should be detached"
    assert (copy / "a.txt").read_text() == "one\n"
    assert not (copy / "b.txt").exists()
    assert git("status", "--porcelain", cwd=copy) == ""


def test_checkout_pushes_to_the_original_repository_as_baton(
    make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path, git: Git
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"a.txt": "one\n"})

    copy = cache.checkout(str(upstream.bare), commit, tmp_path / "copy")

    assert git("remote", "get-url", "origin", cwd=copy) == str(upstream.bare)
    assert git("config", "--local", "user.name", cwd=copy) == "Baton"
    assert git("config", "--local", "user.email", cwd=copy) == "baton@localhost"
    git("push", "--quiet", "origin", "HEAD:refs/heads/from-the-copy", cwd=copy)
    assert git("rev-parse", "refs/heads/from-the-copy", cwd=upstream.bare) == commit


def test_a_relative_path_names_the_same_mirror_as_the_absolute_one(
    make_upstream: Callable[[], Upstream], cache: RepoCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    monkeypatch.chdir(upstream.bare.parent)

    assert cache.mirror("origin.git") == cache.mirror(str(upstream.bare))


def test_checkout_of_an_unknown_commit_names_the_commit_and_the_repository(
    make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    unknown = "0123456789abcdef0123456789abcdef01234567"

    with pytest.raises(RepoError) as caught:
        cache.checkout(str(upstream.bare), unknown, tmp_path / "copy")

    assert unknown in str(caught.value)
    assert str(upstream.bare) in str(caught.value)


def test_mirror_of_a_missing_repository_says_what_git_said(
    cache: RepoCache, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-repo"

    with pytest.raises(RepoError) as caught:
        cache.mirror(str(missing))

    assert str(missing) in str(caught.value)
    assert "does not exist" in str(caught.value)
    assert not list(cache.root.glob("*.partial")), "a failed clone left a partial mirror"


def test_credentials_in_a_url_never_appear_in_an_error(cache: RepoCache) -> None:
    with pytest.raises(RepoError) as caught:
        cache.mirror("http://someone:s3cret-token@127.0.0.1:9/repo.git")

    assert "s3cret-token" not in str(caught.value)
    assert "http://***@127.0.0.1:9/repo.git" in str(caught.value)


def test_four_threads_mirroring_at_once_share_one_mirror(
    make_upstream: Callable[[], Upstream], cache: RepoCache, git: Git
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"a.txt": "one\n"})

    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: cache.mirror(str(upstream.bare)), range(12)))

    assert len(set(paths)) == 1
    assert git("rev-parse", "refs/heads/main", cwd=paths[0]) == commit
    assert sorted(p.name for p in cache.root.iterdir()) == [paths[0].name, f"{paths[0].stem}.lock"]


def test_two_processes_mirroring_at_once_share_one_mirror(
    make_upstream: Callable[[], Upstream], cache: RepoCache, git: Git
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"a.txt": "one\n"})
    script = (
        "import sys; from pathlib import Path; from workers.mirrors import RepoCache\n"
        "for _ in range(3): print(RepoCache(Path(sys.argv[1])).mirror(sys.argv[2]))"
    )
    argv = [sys.executable, "-c", script, str(cache.root), str(upstream.bare)]

    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=60) for proc in procs]

    assert [proc.returncode for proc in procs] == [0, 0], outputs
    printed = {line for out, _ in outputs for line in out.decode().split()}
    assert len(printed) == 1
    mirror = Path(printed.pop())
    assert git("rev-parse", "refs/heads/main", cwd=mirror) == commit


def test_an_archive_holds_the_commit_tree_owned_by_the_sandbox_user(
    make_upstream: Callable[[], Upstream], cache: RepoCache
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"a.txt": "one\n", "pkg/b.py": "x = 1\n"})
    upstream.commit({"a.txt": "two\n"})

    data = cache.archive(str(upstream.bare), commit, uid=1000, gid=1000)

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        files = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    assert {(m.uid, m.gid) for m in members} == {(1000, 1000)}
    assert files == {"a.txt": b"one\n", "pkg/b.py": b"x = 1\n"}


def test_symlinks_out_of_the_tree_become_files_saying_so_and_the_rest_stay(
    make_upstream: Callable[[], Upstream], cache: RepoCache, git: Git
) -> None:
    upstream = make_upstream()
    upstream.commit({"pkg/a.py": "x = 1\n", "-rf": "not an option\n", "naïve ✓.txt": "ok\n"})
    links = {"shared": "..", "deep/up": "../../..", "etc": "/etc", "pkg/alias.py": "a.py",
             "pkg/sibling": "../deep"}  # fmt: skip
    for name, target in links.items():
        path = upstream.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    commit = upstream.commit({}, "links")

    data = cache.archive(str(upstream.bare), commit, uid=1000, gid=1000)

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        kept = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
        markers = {
            m.name: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and m.name in links
        }
        names = set(tar.getnames())
    assert kept == {"pkg/alias.py": "a.py", "pkg/sibling": "../deep"}
    assert set(markers) == {"shared", "deep/up", "etc"}
    assert "symbolic link to '/etc', which leads outside the repository" in markers["etc"]
    assert {"-rf", "naïve ✓.txt"} <= names


@pytest.mark.parametrize("use", ["checkout", "archive"])
def test_a_commit_the_origin_does_not_have_is_named_in_the_error(
    use: str, make_upstream: Callable[[], Upstream], cache: RepoCache, tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    missing = "0" * 40

    with pytest.raises(RepoError, match=f"commit '{missing}' is not in .*, even after a fetch"):
        if use == "checkout":
            cache.checkout(str(upstream.bare), missing, tmp_path / "work")
        else:
            cache.archive(str(upstream.bare), missing, uid=1000, gid=1000)


def test_the_diff_of_a_change_is_from_the_merge_base_as_a_pull_request_shows_it(
    make_upstream: Callable[[], Upstream], cache: RepoCache, git: Git
) -> None:
    upstream = make_upstream()
    base = upstream.commit({"cart.py": "a = 1\n", "notes.txt": "one\n"})
    git("checkout", "--quiet", "-b", "feature", cwd=upstream.work)
    (upstream.work / "cart.py").write_text("a = 2\n")
    git("commit", "--quiet", "-am", "feature", cwd=upstream.work)
    git("push", "--quiet", "origin", "HEAD:feature", cwd=upstream.work)
    head = git("rev-parse", "HEAD", cwd=upstream.work)
    git("checkout", "--quiet", "main", cwd=upstream.work)
    moved = upstream.commit({"notes.txt": "two\n"})  # main moves on after the branch point

    diff = cache.diff(str(upstream.bare), moved, head)

    assert "-a = 1\n+a = 2\n" in diff
    assert "notes.txt" not in diff  # main's own later change is not the branch's
    assert cache.diff(str(upstream.bare), base, base) == ""


def test_the_diff_fetches_a_head_pushed_after_the_mirror_was_made(
    make_upstream: Callable[[], Upstream], cache: RepoCache
) -> None:
    upstream = make_upstream()
    base = upstream.commit({"cart.py": "a = 1\n"})
    cache.mirror(str(upstream.bare))
    head = upstream.commit({"cart.py": "a = 3\n"})

    assert "+a = 3\n" in cache.diff(str(upstream.bare), base, head)


def test_a_commits_version_is_its_nearest_release_tag(
    make_upstream: Callable[[], Upstream], cache: RepoCache, git: Git
) -> None:
    upstream = make_upstream()
    released = upstream.commit({"a.txt": "one\n"})
    git("tag", "v1.6.0", released, cwd=upstream.work)
    later = upstream.commit({"a.txt": "two\n"})
    git("tag", "nightly", later, cwd=upstream.work)
    untagged = make_upstream()
    alone = untagged.commit({"a.txt": "one\n"})
    git("push", "-q", "--tags", "origin", cwd=upstream.work)

    assert cache.version(str(upstream.bare), released) == "1.6.0"
    assert cache.version(str(upstream.bare), later) == "1.6.0"  # `nightly` names no version
    assert cache.version(str(untagged.bare), alone) is None


@pytest.mark.parametrize("python", ["3.11.4 and later", "3.11.2"])
def test_a_tree_unpacks_with_its_inner_links_and_an_entry_leading_out_is_refused(
    python: str,
    make_upstream: Callable[[], Upstream],
    cache: RepoCache,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if python == "3.11.2":  # Debian bookworm's, in the service image: no extraction filters
        monkeypatch.delattr(tarfile, "data_filter")
    upstream = make_upstream()
    (upstream.work / "alias.py").symlink_to("a.py")
    commit = upstream.commit({"a.py": "x = 1\n", "pkg/b.py": "y = 2\n"})
    tree = cache.archive(str(upstream.bare), commit, uid=os.getuid(), gid=os.getgid())

    unpack_tree(tree, tmp_path / "tree")

    assert (tmp_path / "tree" / "alias.py").read_text() == "x = 1\n"
    assert (tmp_path / "tree" / "pkg" / "b.py").read_text() == "y = 2\n"
    crafted = io.BytesIO()
    with tarfile.open(fileobj=crafted, mode="w") as archive:
        link = tarfile.TarInfo("up")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc"
        archive.addfile(link)
    with pytest.raises((RepoError, tarfile.TarError)):
        unpack_tree(crafted.getvalue(), tmp_path / "crafted")
    assert not (tmp_path / "crafted" / "up").exists()

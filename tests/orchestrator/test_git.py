"""Git on the host (`orchestrator.core.git`) against real git: the runner, its errors, pinning a
commit, and which local paths count as a repository."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core.errors import RepoError
from orchestrator.core.git import (
    COMMITTER,
    check_repository_root,
    git_output,
    git_output_bytes,
    redact,
    resolve_commit,
    run_git,
)
from tests.repos import Git, Upstream

# -- the runner -----------------------------------------------------------------------------------


def test_git_runs_with_nothing_of_the_callers_environment_but_path_and_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_must-not-reach-git")
    monkeypatch.setenv("GIT_DIR", "/nowhere")

    shown = run_git(["-c", "alias.environment=!env", "environment"])

    names = {line.split(b"=", 1)[0] for line in shown.stdout.splitlines()}
    assert shown.returncode == 0, shown.stderr
    assert b"ghp_must-not-reach-git" not in shown.stdout
    assert {b"PATH", b"HOME"} <= names
    assert b"GITHUB_TOKEN" not in names


def test_configuration_reaches_git_through_its_environment_not_its_arguments() -> None:
    config = {"user.name": "Someone Else", "core.hooksPath": "/dev/null"}

    shown = run_git(["config", "--get", "user.name"], config=config)
    argv = run_git(["-c", "alias.argv=!tr '\\0' ' ' </proc/$PPID/cmdline", "argv"], config=config)

    assert shown.stdout == b"Someone Else\n"
    assert argv.stdout.startswith(b"git -c alias.argv"), argv.stderr
    assert b"Someone" not in argv.stdout


def test_baton_commits_as_baton(git: Git, tmp_path: Path) -> None:
    git("init", "--quiet", tmp_path)

    git_output(str(tmp_path), ["-C", str(tmp_path), "commit", "--quiet", "--allow-empty",
                               "-m", "x"], config=COMMITTER)  # fmt: skip

    assert git("log", "-1", "--format=%an <%ae>|%cn <%ce>", cwd=tmp_path) == (
        "Baton <baton@localhost>|Baton <baton@localhost>"
    )


def test_output_in_bytes_is_byte_for_byte(git: Git, tmp_path: Path) -> None:
    data = b"\x00\xff\r\n not text \x89\n"
    (tmp_path / "blob").write_bytes(data)
    git("init", "--quiet", tmp_path)
    git("add", "blob", cwd=tmp_path)
    git("commit", "--quiet", "-m", "blob", cwd=tmp_path)

    shown = git_output_bytes(str(tmp_path), ["-C", str(tmp_path), "show", "HEAD:blob"])

    assert shown == data


def test_a_failure_names_the_command_and_repository_without_credentials_and_quotes_git(
    tmp_path: Path,
) -> None:
    source = "https://someone:s3cret@example.invalid/shop.git"
    missing = tmp_path / "missing"

    with pytest.raises(RepoError) as caught:
        git_output(source, ["-C", str(missing), "-c", "a.b=c", "status"])

    assert str(caught.value) == (
        "git status of https://***@example.invalid/shop.git failed: "
        f"fatal: cannot change to '{missing}': No such file or directory"
    )


def test_a_command_over_its_time_limit_is_an_error_naming_the_limit(tmp_path: Path) -> None:
    with pytest.raises(RepoError) as caught:
        git_output(str(tmp_path), ["-c", "alias.slow=!sleep 5", "slow"], timeout_s=0.3)

    assert str(caught.value) == f"git slow of {tmp_path} took over 0.3 s"


def test_redact_hides_given_secrets_and_credentials_in_urls() -> None:
    text = "push to https://x-access-token:abc@github.com/o/r failed; header AUTH basic Zm9v"

    assert redact(text, ["Zm9v", ""]) == (
        "push to https://***@github.com/o/r failed; header AUTH basic ***"
    )


# -- pinning a commit -----------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["HEAD", "main"])
def test_resolve_commit_of_a_local_path_gives_the_full_sha(
    make_upstream: Callable[[], Upstream], ref: str
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    newest = upstream.commit({"a.txt": "two\n"})

    assert resolve_commit(str(upstream.work), ref) == newest


def test_resolve_commit_of_an_older_ref_in_a_local_path(
    make_upstream: Callable[[], Upstream],
) -> None:
    upstream = make_upstream()
    older = upstream.commit({"a.txt": "one\n"})
    upstream.commit({"a.txt": "two\n"})

    assert resolve_commit(str(upstream.work), "HEAD~1") == older


@pytest.mark.parametrize("ref", ["HEAD", "main", "refs/heads/main"])
def test_resolve_commit_of_a_url_asks_the_remote(
    make_upstream: Callable[[], Upstream], ref: str
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    newest = upstream.commit({"a.txt": "two\n"})

    assert resolve_commit(upstream.bare.as_uri(), ref) == newest


@pytest.mark.parametrize("use_url", [False, True])
def test_a_tag_or_another_branch_of_a_bare_repository_whose_head_names_no_branch_is_pinned(
    make_upstream: Callable[[], Upstream], git: Git, use_url: bool
) -> None:
    upstream = make_upstream()
    tagged = upstream.commit({"a.txt": "one\n"})
    git("tag", "v1.0", cwd=upstream.work)
    git("push", "--quiet", "origin", "v1.0", "HEAD:release", cwd=upstream.work)
    upstream.commit({"a.txt": "two\n"})
    git("symbolic-ref", "HEAD", "refs/heads/gone", cwd=upstream.bare)  # a HEAD with no branch
    repo = upstream.bare.as_uri() if use_url else str(upstream.bare)

    assert resolve_commit(repo, "v1.0") == tagged
    assert resolve_commit(repo, "release") == tagged
    assert resolve_commit(repo, tagged) == tagged
    with pytest.raises(RepoError, match="pick a branch, tag or commit with --ref"):
        resolve_commit(repo)


@pytest.mark.parametrize("use_url", [False, True])
def test_resolve_commit_of_an_unknown_ref_raises_repo_error(
    make_upstream: Callable[[], Upstream], use_url: bool
) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    repo = upstream.bare.as_uri() if use_url else str(upstream.bare)

    with pytest.raises(RepoError, match="no-such-branch"):
        resolve_commit(repo, "no-such-branch")


def test_resolve_commit_of_a_folder_inside_a_repository_is_refused_not_answered_for_it(
    make_upstream: Callable[[], Upstream],
) -> None:
    upstream = make_upstream()
    upstream.commit({"sub/a.txt": "one\n"})

    with pytest.raises(RepoError, match="not the root of a git repository"):
        resolve_commit(str(upstream.work / "sub"))


# -- which local paths are a repository -----------------------------------------------------------


@pytest.mark.parametrize("which", ["a working tree's top", "a bare repository"])
def test_the_root_of_a_repository_is_one(which: str, make_upstream: Callable[[], Upstream]) -> None:
    upstream = make_upstream()
    upstream.commit({"a.txt": "one\n"})
    root = upstream.work if which == "a working tree's top" else upstream.bare

    check_repository_root(str(root))  # raises if not


@pytest.mark.parametrize(
    ("inside", "root_of"),
    [("work/sub", "work"), ("work/.git", "work"), ("work/.git/refs", "work"),
     ("origin.git/refs", "origin.git")],
)  # fmt: skip
def test_a_folder_inside_a_repository_is_refused_naming_the_enclosing_root(
    inside: str, root_of: str, make_upstream: Callable[[], Upstream]
) -> None:
    upstream = make_upstream()
    upstream.commit({"sub/a.txt": "one\n"})
    path = upstream.base / inside

    with pytest.raises(RepoError) as caught:
        check_repository_root(str(path))

    assert str(caught.value) == (
        f"{path}: not the root of a git repository (it is inside the repository whose root is "
        f"{upstream.base / root_of}); give the repository's root, or make it a repository with "
        "`git init`"
    )


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda path: path.mkdir(), "not a git repository; give the repository's root, or make "
         "it a repository with `git init`"),
        (lambda path: None, "no such folder; give the root of a git repository (or its URL)"),
        (lambda path: path.write_text("x"), "not a folder; give the root of a git repository "
         "(or its URL)"),
    ],
    ids=["a plain folder", "nothing", "a file"],
)  # fmt: skip
def test_a_path_that_is_no_repository_is_refused_saying_what_it_is(
    make: Callable[[Path], object], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path / "given")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(RepoError) as caught:
        check_repository_root("given")

    assert str(caught.value) == f"given: {said}"

"""Publishing a fix against real git (a bare origin, real diffs) and a fake GitHub REST API."""

from __future__ import annotations

import base64
import logging
import pickle
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.core.rules import ChangeClass
from testkit.github import FakeGitHub
from tests.fences import failing_at
from tests.repos import Git, Upstream
from workers.changes import ChangePolicy
from workers.errors import PublishError
from workers.github import GitHubPacing, git_auth_config, github_slug
from workers.mirrors import RepoCache
from workers.publish import Publisher, PublishResult

TOKEN = "ghp_TestTokenThatMustNeverLeak0123456789"
GITHUB_REMOTE = "https://github.com/octo/widgets.git"
BINARY = bytes(range(256)) * 4
UNPACED = GitHubPacing(request_gap_s=0, write_gap_s=0)
"""The fake GitHub has no rate limits to keep clear of: its requests are not spaced."""


def redate(git: Git, upstream: Upstream, branch: str) -> str:
    """Replace the branch's head on the origin with a copy made years ago: same tree, parent and
    message, another date, so another sha."""
    tree, parent, message = (
        git("log", "-1", f"--format={field}", branch, cwd=upstream.bare)
        for field in ("%T", "%P", "%B")
    )
    dated = {"GIT_AUTHOR_DATE": "2001-02-03T04:05:06", "GIT_COMMITTER_DATE": "2001-02-03T04:05:06"}
    old = git("commit-tree", tree, "-p", parent, "-m", message, cwd=upstream.bare, env=dated)
    git("update-ref", f"refs/heads/{branch}", old, cwd=upstream.bare)
    return old


@pytest.fixture
def upstream(make_upstream: Callable[[], Upstream]) -> Upstream:
    """A repository with two commits on `main`; runs are pinned to the first."""
    made = make_upstream()
    made.commit({"app.py": b"def answer():\n    return 41\n", "logo.bin": BINARY}, "first")
    made.commit({"README.md": b"later work on main\n"}, "second")
    return made


@pytest.fixture
def publisher(tmp_path: Path) -> Publisher:
    return Publisher(RepoCache(tmp_path / "cache"))


FIX = {"app.py": b"def answer():\n    return 42\n"}
MESSAGE = (
    "Return the right answer\n\nThe answer was off by one.\n\n"
    "Changed files, as Baton checked them:\n- `app.py` — modified; code\n"
)


def publish(
    publisher: Publisher,
    upstream: Upstream,
    diff: bytes,
    workdir: Path,
    *,
    branch: str = "baton/run-1",
    repo: str | None = None,
    policy: ChangePolicy | None = None,
) -> PublishResult:
    return publisher.publish(
        repo=repo or str(upstream.bare),
        commit=upstream.pinned,
        diff=diff,
        branch=branch,
        title="Return the right answer",
        body="The answer was off by one.",
        workdir=workdir,
        policy=policy,
    )


# -- git ----------------------------------------------------------------------------------------


def test_publish_pushes_one_commit_holding_exactly_the_diff_on_top_of_the_pinned_commit(
    upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    diff = upstream.diff(FIX)

    result = publish(publisher, upstream, diff, tmp_path / "run")

    assert result == PublishResult(branch="baton/run-1", commit=result.commit, pushed=True)
    assert upstream.commits_on("baton/run-1") == [result.commit]
    on_origin = git.raw("diff", "--binary", upstream.pinned, "baton/run-1", cwd=upstream.bare)
    assert on_origin == diff
    shown = git("show", "baton/run-1:app.py", cwd=upstream.bare)
    assert shown == "def answer():\n    return 42"
    raw = git("cat-file", "commit", result.commit, cwd=upstream.bare)
    assert raw.split("\n\n", 1)[1] == MESSAGE.strip()
    assert f"parent {upstream.pinned}" in raw.splitlines()
    assert git("log", "-1", "--format=%cn <%ce>", result.commit, cwd=upstream.bare) == (
        "Baton <baton@localhost>"
    )


@pytest.mark.parametrize(
    "second_attempt",
    ["the same workdir", "a new workdir", "another host's cache", "a leftover working copy"],
)
def test_publishing_the_same_diff_again_pushes_nothing_and_returns_the_same_commit(
    second_attempt: str, upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    diff = upstream.diff(FIX)
    first = publish(publisher, upstream, diff, tmp_path / "run")
    earlier = redate(git, upstream, "baton/run-1")
    workdir, again = tmp_path / "run", publisher
    if second_attempt == "a new workdir":
        workdir = tmp_path / "rerun"
    elif second_attempt == "another host's cache":
        workdir, again = tmp_path / "rerun", Publisher(RepoCache(tmp_path / "other-cache"))
    elif second_attempt == "a leftover working copy":
        (workdir / "publish" / "junk.txt").write_text("left by a worker that died\n")

    second = publish(again, upstream, diff, workdir)

    assert earlier != first.commit
    assert second == PublishResult(branch="baton/run-1", commit=earlier, pushed=False)
    assert upstream.branches() == ["refs/heads/baton/run-1", "refs/heads/main"]
    assert upstream.commits_on("baton/run-1") == [earlier]


def test_a_different_diff_for_the_same_branch_replaces_the_earlier_attempt(
    upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    first = publish(publisher, upstream, upstream.diff(FIX), tmp_path / "run")
    better = upstream.diff({"app.py": b"ANSWER = 42\n\n\ndef answer():\n    return ANSWER\n"})

    second = publish(publisher, upstream, better, tmp_path / "rerun")

    assert second.pushed is True
    assert second.commit != first.commit
    assert upstream.commits_on("baton/run-1") == [second.commit]
    on_origin = git.raw("diff", "--binary", upstream.pinned, "baton/run-1", cwd=upstream.bare)
    assert on_origin == better


def test_a_push_made_by_someone_else_meanwhile_is_not_overwritten(
    upstream: Upstream,
    publisher: Publisher,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    git: Git,
) -> None:
    publish(publisher, upstream, upstream.diff(FIX), tmp_path / "run")
    git("fetch", "--quiet", "origin", "baton/run-1", cwd=upstream.work)
    git("checkout", "--quiet", "--detach", "FETCH_HEAD", cwd=upstream.work)
    (upstream.work / "theirs.txt").write_text("a reviewer's commit\n")
    git("add", "theirs.txt", cwd=upstream.work)
    git("commit", "--quiet", "-m", "reviewer", cwd=upstream.work)
    theirs = git("rev-parse", "HEAD", cwd=upstream.work)
    real_run = subprocess.run

    def push_theirs_first(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        if "push" in argv and "--no-verify" in argv:  # the publisher's push, not ours below
            git("push", "--quiet", "origin", "HEAD:refs/heads/baton/run-1", cwd=upstream.work)
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", push_theirs_first)
    other = upstream.diff({"app.py": b"def answer():\n    return 6 * 7\n"})

    with pytest.raises(PublishError, match="someone else pushed") as caught:
        publish(publisher, upstream, other, tmp_path / "rerun")

    assert "baton/run-1" in str(caught.value)
    assert git("rev-parse", "baton/run-1", cwd=upstream.bare) == theirs


@pytest.mark.parametrize("diff", [b"", b"\n  \n"])
def test_an_empty_diff_is_refused_and_nothing_is_pushed(
    diff: bytes, upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    with pytest.raises(PublishError) as caught:
        publish(publisher, upstream, diff, tmp_path / "run")

    assert str(caught.value) == (
        f"cannot publish baton/run-1 to {upstream.bare}: "
        "nothing to publish: the fix's diff is empty"
    )
    assert upstream.branches() == ["refs/heads/main"]


def test_a_diff_that_does_not_apply_is_refused_with_the_branch_and_gits_message(
    upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    newer = git("rev-parse", "main", cwd=upstream.bare)
    upstream.commit({"app.py": b"def answer():\n    return 'rewritten on main'\n"}, "third")
    diff = upstream.diff({"app.py": b"def answer():\n    return 43\n"}, base="main")

    with pytest.raises(PublishError) as caught:
        publish(publisher, upstream, diff, tmp_path / "run")

    message = str(caught.value)
    assert message.startswith(
        f"cannot publish baton/run-1 to {upstream.bare}: "
        f"the diff does not apply to commit {upstream.pinned}: "
    )
    assert "patch failed: app.py:1" in message
    assert newer != upstream.pinned
    assert upstream.branches() == ["refs/heads/main"]


def test_an_invalid_branch_name_is_refused_before_anything_is_cloned(
    upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    with pytest.raises(PublishError, match="not a valid branch name"):
        publish(publisher, upstream, upstream.diff(FIX), tmp_path / "run", branch="baton/..bad")

    assert not (tmp_path / "cache").exists()


def test_binary_and_non_utf8_files_survive_publishing(
    upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    changed = {
        "logo.bin": BINARY[::-1],
        "new.bin": b"\x00\xff\x00 brand new \x89PNG\r\n\x1a\n",
        "latin1.txt": "café crème\n".encode("latin-1"),
    }

    publish(publisher, upstream, upstream.diff(changed), tmp_path / "run")

    for name, data in changed.items():
        assert git.raw("show", f"baton/run-1:{name}", cwd=upstream.bare) == data


def test_publish_error_pickles_so_it_can_cross_celery() -> None:
    error = PublishError("cannot publish baton/run-1 to /repo: git push failed")

    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is PublishError
    assert str(copy) == "cannot publish baton/run-1 to /repo: git push failed"


# -- GitHub -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remote", "slug"),
    [
        ("https://github.com/octo/widgets", "octo/widgets"),
        ("https://github.com/octo/widgets.git", "octo/widgets"),
        ("https://GitHub.com/octo/widgets/", "octo/widgets"),
        ("https://x-access-token@github.com/octo/wid.gets.git", "octo/wid.gets"),
        ("git@github.com:octo/widgets.git", "octo/widgets"),
        ("ssh://git@github.com/octo/widgets.git", "octo/widgets"),
        ("ssh://git@github.com:22/octo/widgets", "octo/widgets"),
        ("https://gitlab.com/octo/widgets.git", None),
        ("https://github.com.evil.example/octo/widgets.git", None),
        ("https://github.com/octo/widgets/tree/main", None),
        ("/srv/git/widgets.git", None),
        ("file:///srv/git/widgets.git", None),
    ],
)
def test_github_slug_recognises_github_remotes_only(remote: str, slug: str | None) -> None:
    assert github_slug(remote) == slug


def test_git_gets_the_token_as_a_basic_auth_header_for_github_only() -> None:
    config = git_auth_config(SecretStr("t0ken"))

    assert list(config) == ["http.https://github.com/.extraheader"]
    scheme, encoded = config["http.https://github.com/.extraheader"].split(" basic ")
    assert scheme == "AUTHORIZATION:"
    assert base64.b64decode(encoded) == b"x-access-token:t0ken"


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    """A fake GitHub API served from a thread for the length of the test."""
    with FakeGitHub.start(token=TOKEN) as fake:
        yield fake


@pytest.fixture
def on_github(upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """GITHUB_REMOTE, which git (through the user's configuration) fetches and pushes from the
    upstream's bare repository: the publisher sees a GitHub remote, git writes locally."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[url "{upstream.bare}"]\n\tinsteadOf = {GITHUB_REMOTE}\n')
    monkeypatch.setenv("HOME", str(home))
    return GITHUB_REMOTE


def github_publisher(tmp_path: Path, fake: FakeGitHub) -> Publisher:
    cache = RepoCache(tmp_path / "cache")
    return Publisher(cache, token=SecretStr(TOKEN), github_api_url=fake.url, github_pacing=UNPACED)


def test_a_pull_request_is_opened_once_from_the_branch_into_the_default_branch(
    upstream: Upstream, on_github: str, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    publisher = github_publisher(tmp_path, fake_github)
    diff = upstream.diff(FIX)

    first = publish(publisher, upstream, diff, tmp_path / "run", repo=on_github)
    second = publish(publisher, upstream, diff, tmp_path / "rerun", repo=on_github)

    url = "https://github.com/octo/widgets/pull/1"
    assert (first.pushed, first.pull_request_url, first.pull_request_number) == (True, url, 1)
    assert first.created_pull_request is True
    assert second == first.model_copy(update={"pushed": False, "created_pull_request": False})
    assert fake_github.posts() == [
        {
            "base": "develop",
            "head": "baton/run-1",
            "title": "Return the right answer",
            "body": MESSAGE.split("\n\n", 1)[1].strip(),  # the listing of files included
        }
    ]
    lists = [entry["query"] for entry in fake_github.requests if entry["path"].endswith("/pulls")]
    assert {"head": "octo:baton/run-1", "state": "all"}.items() <= lists[0].items()
    assert {entry["authorization"] for entry in fake_github.requests} == {f"token {TOKEN}"}
    assert upstream.commits_on("baton/run-1") == [first.commit]


def test_a_pull_request_opened_meanwhile_is_returned_instead_of_a_second_one(
    upstream: Upstream, on_github: str, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    fake_github.add_pull("baton/run-1", "develop", "opened by a concurrent attempt")
    fake_github.stale_lists = 1

    result = publish(
        github_publisher(tmp_path, fake_github),
        upstream,
        upstream.diff(FIX),
        tmp_path / "run",
        repo=on_github,
    )

    assert (result.pull_request_number, result.created_pull_request) == (1, False)
    assert len(fake_github.pulls) == 1


def test_without_a_token_no_pull_request_is_asked_for(
    upstream: Upstream, on_github: str, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    publisher = Publisher(RepoCache(tmp_path / "cache"), github_api_url=fake_github.url)

    result = publish(publisher, upstream, upstream.diff(FIX), tmp_path / "run", repo=on_github)

    assert result == PublishResult(branch="baton/run-1", commit=result.commit, pushed=True)
    assert fake_github.requests == []


def test_a_remote_not_on_github_gets_no_pull_request_even_with_a_token(
    upstream: Upstream, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    result = publish(
        github_publisher(tmp_path, fake_github), upstream, upstream.diff(FIX), tmp_path / "run"
    )

    assert (result.pushed, result.pull_request_url) == (True, None)
    assert fake_github.requests == []


def test_a_refused_pull_request_names_the_branch_and_the_status_but_never_the_token(
    upstream: Upstream, on_github: str, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    fake_github.refuse_create = 403

    with pytest.raises(PublishError) as caught:
        publish(
            github_publisher(tmp_path, fake_github),
            upstream,
            upstream.diff(FIX),
            tmp_path / "run",
            repo=on_github,
        )

    message = str(caught.value)
    assert message.startswith(f"cannot publish baton/run-1 to {GITHUB_REMOTE}: the branch holds ")
    assert message.endswith(
        "but GitHub refused the pull request (403: Resource not accessible by integration; "
        "token *** may not write pull requests); "
        "check that the token may write pull requests of the repository"
    )
    assert upstream.commits_on("baton/run-1") != []


def test_the_token_reaches_git_only_through_its_environment_and_never_a_log_or_error(
    upstream: Upstream,
    on_github: str,
    fake_github: FakeGitHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    commands: list[tuple[list[str], dict[str, str]]] = []
    real_run = subprocess.run

    def recording(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        commands.append((list(argv), dict(kwargs.get("env") or {})))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording)
    publisher = github_publisher(tmp_path, fake_github)
    publish(publisher, upstream, upstream.diff(FIX), tmp_path / "run", repo=on_github)
    fake_github.refuse_create = 403
    errors: list[str] = []
    for branch, diff in [("baton/run-2", b"not a diff\n"), ("baton/run-3", upstream.diff(FIX))]:
        with pytest.raises(PublishError) as caught:
            publish(publisher, upstream, diff, tmp_path / branch, branch=branch, repo=on_github)
        errors.append(str(caught.value))

    encoded = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    pushes = [env for argv, env in commands if argv[:1] == ["git"] and "push" in argv]
    assert pushes, "no push was recorded"
    for env in pushes:
        count = int(env["GIT_CONFIG_COUNT"])
        config = {env[f"GIT_CONFIG_KEY_{n}"]: env[f"GIT_CONFIG_VALUE_{n}"] for n in range(count)}
        header = config["http.https://github.com/.extraheader"]
        assert header == f"AUTHORIZATION: basic {encoded}"
    assert any("GitHub refused" in error for error in errors)
    logged = [record.getMessage() for record in caplog.records]
    assert any("opened pull request #1" in line for line in logged)
    for text in [*errors, *logged, *(" ".join(argv) for argv, _ in commands)]:
        assert TOKEN not in text
        assert encoded not in text


# -- the fence of a cancelled run ---------------------------------------------------------------


class Cancelled(Exception):
    """What a fence raises in these tests once the run is cancelled."""


def fence_failing_at(n: int) -> tuple[Callable[[], None], list[int]]:
    """A fence that raises `Cancelled` from its `n`-th call on; the calls are counted."""
    return failing_at(n, Cancelled)


def test_a_fence_that_fails_before_the_push_pushes_nothing(
    upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    fence, calls = fence_failing_at(1)

    with pytest.raises(Cancelled):
        publisher.publish(
            repo=str(upstream.bare), commit=upstream.pinned, diff=upstream.diff(FIX),
            branch="baton/run-1", title="t", body="b", workdir=tmp_path, fence=fence,
        )  # fmt: skip

    assert calls == [1]
    assert upstream.branches() == ["refs/heads/main"]


def test_a_cancel_that_lands_during_the_push_takes_the_branch_back(
    upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    fence, calls = fence_failing_at(2)  # passes before the push, fails right after it

    with pytest.raises(Cancelled):
        publisher.publish(
            repo=str(upstream.bare), commit=upstream.pinned, diff=upstream.diff(FIX),
            branch="baton/run-1", title="t", body="b", workdir=tmp_path, fence=fence,
        )  # fmt: skip

    assert calls == [1, 2]
    assert upstream.branches() == ["refs/heads/main"]


def test_taking_a_push_back_restores_what_the_branch_held_before(
    upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    earlier = publish(publisher, upstream, upstream.diff(FIX), tmp_path / "first")
    other = upstream.diff({"app.py": b"def answer():\n    return 43\n"})
    fence, _ = fence_failing_at(2)

    with pytest.raises(Cancelled):
        publisher.publish(
            repo=str(upstream.bare), commit=upstream.pinned, diff=other,
            branch="baton/run-1", title="t", body="b", workdir=tmp_path / "second", fence=fence,
        )  # fmt: skip

    assert upstream.commits_on("baton/run-1") == [earlier.commit]


# -- what may be published ----------------------------------------------------------------------

WORKFLOW = {".github/workflows/x.yml": b"on: push\njobs: {}\n"}
PLANNED = ChangePolicy.of(["app.py"], [])


def test_a_change_outside_the_plan_into_ci_is_refused_naming_the_file_and_nothing_is_pushed(
    upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    diff = upstream.diff({**FIX, **WORKFLOW})

    with pytest.raises(PublishError) as refused:
        publish(publisher, upstream, diff, tmp_path / "run", policy=PLANNED)

    assert "refused: the change holds what this pipeline does not publish: " \
        ".github/workflows/x.yml (unplanned, ci)" in str(refused.value)  # fmt: skip
    assert "app.py" not in str(refused.value).split("publish: ", 1)[1]
    assert upstream.branches() == ["refs/heads/main"]


def test_allowed_classes_are_published_and_every_changed_file_is_listed_with_its_class(
    upstream: Upstream, publisher: Publisher, tmp_path: Path, git: Git
) -> None:
    lock = {"requirements.txt": b"requests==2.32.3\n", "logo.bin": BINARY[::-1]}
    diff = upstream.diff({**FIX, **WORKFLOW, **lock})
    allowing = ChangePolicy.of(
        ["app.py"], [ChangeClass.UNPLANNED, ChangeClass.CI, ChangeClass.DEPENDENCIES,
                     ChangeClass.BINARY],
    )  # fmt: skip

    result = publish(publisher, upstream, diff, tmp_path / "run", policy=allowing)

    body = git("log", "-1", "--format=%b", result.commit, cwd=upstream.bare)
    assert body.split("\n\n", 1)[1].splitlines() == [
        "Changed files, as Baton checked them:",
        "- `.github/workflows/x.yml` — added; unplanned (allowed), ci (allowed)",
        "- `app.py` — modified; planned",
        "- `logo.bin` — modified; unplanned (allowed), binary (allowed)",
        "- `requirements.txt` — added; unplanned (allowed), dependencies (allowed)",
    ]


SYMLINK = b"""diff --git a/passwd b/passwd
new file mode 120000
--- /dev/null
+++ b/passwd
@@ -0,0 +1 @@
+/etc/passwd
\\ No newline at end of file
"""
EXECUTABLE = b"""diff --git a/app.py b/app.py
old mode 100644
new mode 100755
"""


@pytest.mark.parametrize(
    ("diff", "said"),
    [(SYMLINK, "refused: passwd is a symlink"),
     (EXECUTABLE, "refused: the change holds what this pipeline does not publish: "
                  "app.py (executable)")],
    ids=["symlink", "executable"],
)  # fmt: skip
def test_what_the_host_reads_back_is_checked_not_what_the_sandbox_said(
    diff: bytes, said: str, upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    every_class_but_executable = ChangePolicy.of(None, set(ChangeClass) - {ChangeClass.EXECUTABLE})

    with pytest.raises(PublishError) as refused:
        publish(publisher, upstream, diff, tmp_path / "run", policy=every_class_but_executable)

    assert said in str(refused.value)
    assert upstream.branches() == ["refs/heads/main"]


@pytest.mark.parametrize(
    ("diff", "said"),
    [
        (None, "the change holds what this pipeline does not publish: .github/workflows/x.yml "
               "(unplanned, ci) (allow a class with the publishing stage's `publish.allow`)"),
        (SYMLINK, "passwd is a symlink; a published change holds none"),
    ],
    ids=["unplanned ci", "symlink"],
)  # fmt: skip
def test_a_change_is_checked_as_publishing_would_check_it_and_nothing_is_pushed(
    diff: bytes | None, said: str, upstream: Upstream, publisher: Publisher, tmp_path: Path
) -> None:
    diff = diff or upstream.diff({**FIX, **WORKFLOW})
    check = {"repo": str(upstream.bare), "commit": upstream.pinned, "workdir": tmp_path}

    refused = publisher.refusal(diff=diff, policy=PLANNED, **check)
    fine = publisher.refusal(diff=upstream.diff(FIX), policy=PLANNED, **check)

    assert (refused, fine) == (said, None)
    assert upstream.branches() == ["refs/heads/main"]
    stale = b"diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"
    with pytest.raises(PublishError, match="does not apply"):
        publisher.refusal(diff=stale, policy=PLANNED, **check)

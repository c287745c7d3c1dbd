"""Publishing a finished fix from the worker host: a branch on `origin`, and a pull request.

Code work happens in sandboxes that never see a credential; what leaves them is a diff (`git
diff --binary` against the run's pinned commit). `Publisher.publish` applies it to a fresh
working copy of that commit, commits it as one commit on the run's branch, pushes the branch
to the original repository and, for a GitHub repository with a token configured, opens a pull
request.

Publishing is idempotent, so a redelivered or re-run `pr` stage is harmless: a branch that
already holds a commit with the same tree, parent and message is left alone; one that holds
anything else is replaced with `--force-with-lease` on the sha just read, so a re-run replaces
its own earlier attempt but never a push that happened meanwhile; an existing pull request from
the branch is returned instead of a second one.

The token stays on this host. Git gets it as configuration in its environment, sent as a header
to `https://github.com/` only (`workers.github.git_auth_config`); it is never in argv, a URL, a
log line, an error message or the result.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests
from github import GithubException
from pydantic import BaseModel, ConfigDict, SecretStr

from orchestrator.core.errors import RepoError
from orchestrator.core.git import (
    COMMITTER,
    GIT_MISSING,
    LOCAL_GIT_TIMEOUT_S,
    NETWORK_GIT_TIMEOUT_S,
    git_said,
    redact,
    repo_source,
    run_git,
)
from orchestrator.core.rules import ChangeClass
from workers.changes import ChangedFile, ChangePolicy, UnsafeChangeError, listing, read_changes
from workers.errors import PublishError
from workers.github import (
    GITHUB_API_URL,
    GITHUB_PACING,
    GitHubAPI,
    GitHubPacing,
    GitHubPullRequest,
    git_auth_config,
    github_slug,
    is_github_https_remote,
    secret_forms,
)
from workers.mirrors import RepoCache

logger = logging.getLogger(__name__)

NO_HOOKS = {"core.hooksPath": "/dev/null"}
"""Git configuration that keeps hooks (the user's global ones included) from running."""


class PublishResult(BaseModel):
    """What `Publisher.publish` did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    branch: str
    """The branch on `origin` that holds the fix."""
    commit: str
    """The fix's commit: one commit on top of the pinned commit."""
    pushed: bool
    """False when the branch already held exactly this change (a re-run)."""
    pull_request_url: str | None = None
    """The pull request's web page; None without a token or for a repository not on GitHub."""
    pull_request_number: int | None = None
    created_pull_request: bool = False
    """False when the pull request existed already (or there is none)."""


class Publisher:
    """Publishes fixes to the repositories of `repos`; `token` authenticates to GitHub, whose
    API at `github_api_url` is called with its requests spaced by `github_pacing`."""

    def __init__(
        self,
        repos: RepoCache,
        *,
        token: SecretStr | None = None,
        github_api_url: str = GITHUB_API_URL,
        github_pacing: GitHubPacing = GITHUB_PACING,
    ) -> None:
        self.repos = repos
        self.token = token
        self.github_api_url = github_api_url
        self.github_pacing = github_pacing

    def publish(
        self,
        *,
        repo: str,
        commit: str,
        diff: bytes,
        branch: str,
        title: str,
        body: str,
        workdir: Path,
        fence: Callable[[], None] | None = None,
        policy: ChangePolicy | None = None,
    ) -> PublishResult:
        """Commit `diff` on top of `commit` as `branch` of `repo`, push it, open a pull request.

        `title` is the commit's subject and the pull request's title, `body` the rest of the
        message and the pull request's description, to which the list of changed files is
        added. The change, as applied here, must pass `policy` (by default: any class of change,
        but never a symlink, a submodule or a path inside `.git`). The working copy is made in
        `workdir / "publish"` (replacing one a failed attempt left there); deleting it is up to
        the caller. `fence` is called right before the push and again right after it, before
        the pull request: if it raises after the push (the run was cancelled meanwhile), the
        branch just pushed is deleted again and its exception goes on. Raises `PublishError`.
        """
        source = self._source(repo, branch)
        copy = _WorkingCopy(
            source, branch, workdir / "publish", self._git_config(source), self._secrets()
        )
        _commit_message(title, body, copy)  # a title, before any work
        if not diff.strip():
            raise copy.error("nothing to publish: the fix's diff is empty")
        _check_branch_name(copy)
        self._checkout(copy, commit)
        tree = _apply(copy, commit, diff)
        policy = policy or ChangePolicy.of(None, ChangeClass)  # any class; nothing unsafe
        body = f"{body.strip()}\n\n{listing(_checked(copy, commit, policy), policy)}"
        subject, message = _commit_message(title, body, copy)
        remote = _remote_head(copy)
        if remote and _has_content(copy, remote, tree=tree, parent=commit, message=message):
            fix, pushed = remote, False
        else:
            fix = copy.out("commit-tree", tree, "-p", commit, "-F", "-", stdin=message.encode())
            if fence is not None:
                fence()
            _push(copy, fix, expected=remote)
            pushed = True
        if fence is not None:
            _fenced(copy, fix, fence, pushed=pushed, expected=remote)
        logger.info(
            "published %s (%d-byte diff) as %s of %s: %s",
            fix[:12],
            len(diff),
            branch,
            redact(source),
            "pushed" if pushed else "already there",
        )
        pull = self._pull_request(copy, fix, subject, body.strip())  # the listing included
        return PublishResult(
            branch=branch,
            commit=fix,
            pushed=pushed,
            pull_request_url=pull.url if pull else None,
            pull_request_number=pull.number if pull else None,
            created_pull_request=pull.created if pull else False,
        )

    def refusal(
        self, *, repo: str, commit: str, diff: bytes, workdir: Path, policy: ChangePolicy
    ) -> str | None:
        """Why `publish` would refuse `diff` on `commit` under `policy` (what it would say after
        "refused: "), or None when it would take it: checked as `publish` checks, on this host,
        with nothing committed or pushed. The working copy is made in `workdir / "check"`.

        Raises:
            PublishError: the check itself could not be made (the commit is gone, the diff does
                not apply).
        """
        copy = _WorkingCopy(self._source(repo, "check"), "check", workdir / "check",
                            self._git_config(repo_source(repo)), self._secrets())  # fmt: skip
        self._checkout(copy, commit)
        _apply(copy, commit, diff)
        try:
            _checked(copy, commit, policy)
        except PublishError as exc:
            said = str(exc)
            if ": refused: " not in said:
                raise
            return said.split(": refused: ", 1)[1]
        return None

    # -- steps --------------------------------------------------------------------------------

    def _source(self, repo: str, branch: str) -> str:
        try:
            return repo_source(repo)
        except RepoError as exc:
            raise PublishError(f"cannot publish {branch}: {exc}") from None

    def _git_config(self, source: str) -> dict[str, str]:
        """Configuration for every git command: no hooks, Baton's identity, GitHub auth."""
        auth = git_auth_config(self.token) if self.token and is_github_https_remote(source) else {}
        return {**NO_HOOKS, **COMMITTER, **auth}

    def _secrets(self) -> list[str]:
        return secret_forms(self.token) if self.token else []

    def _checkout(self, copy: _WorkingCopy, commit: str) -> None:
        shutil.rmtree(copy.path, ignore_errors=True)  # left by an attempt that died half-way
        try:
            self.repos.checkout(copy.source, commit, copy.path)
        except RepoError as exc:
            raise copy.error(f"cannot check out commit {commit}: {exc}") from None

    def _pull_request(
        self, copy: _WorkingCopy, fix: str, title: str, body: str
    ) -> GitHubPullRequest | None:
        slug = github_slug(copy.source)
        if not (slug and self.token):
            return None
        github = GitHubAPI(self.token, api_url=self.github_api_url, pacing=self.github_pacing)
        try:
            pull = github.open_pull_request(slug, branch=copy.branch, title=title, body=body)
        except GithubException as exc:
            raise copy.error(
                f"the branch holds {fix[:12]}, but GitHub refused the pull request "
                f"({exc.status}: {_github_said(exc)}); "
                "check that the token may write pull requests of the repository"
            ) from None
        except requests.RequestException as exc:
            raise copy.error(
                f"the branch holds {fix[:12]}, but GitHub at {self.github_api_url} is unreachable "
                f"({type(exc).__name__}: {exc}); run the stage again"
            ) from None
        verb = "opened" if pull.created else "found"
        logger.info("%s pull request #%d for %s of %s", verb, pull.number, copy.branch, slug)
        return pull


@dataclass(frozen=True)
class _WorkingCopy:
    """The working copy of one publication and git in it; its errors name the branch and the
    repository.

    `config` reaches git through its environment (`GIT_CONFIG_COUNT`…), never through argv;
    `secrets` are cut out of every message git writes before it is quoted.
    """

    source: str
    branch: str
    path: Path
    config: Mapping[str, str] = field(repr=False)
    secrets: Sequence[str] = field(repr=False)

    def run(
        self, *args: str, stdin: bytes = b"", network: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        """`git -C <copy> *args`; a failing command is returned, not raised."""
        timeout_s = NETWORK_GIT_TIMEOUT_S if network else LOCAL_GIT_TIMEOUT_S
        argv = ["-C", str(self.path), *args]
        try:
            return run_git(argv, timeout_s=timeout_s, stdin=stdin, config=self.config)
        except FileNotFoundError:
            raise self.error(GIT_MISSING) from None
        except subprocess.TimeoutExpired:
            raise self.error(f"git {args[0]} took over {timeout_s:g} s") from None

    def out(self, *args: str, stdin: bytes = b"", network: bool = False) -> str:
        """The stripped stdout of a command that must succeed."""
        result = self.run(*args, stdin=stdin, network=network)
        if result.returncode != 0:
            raise self.error(f"git {args[0]} failed", result)
        return result.stdout.decode(errors="replace").strip()

    def error(
        self, what: str, result: subprocess.CompletedProcess[bytes] | None = None
    ) -> PublishError:
        """A `PublishError` saying what failed, quoting git's words without any secret."""
        said = f": {git_said(result)}" if result else ""
        text = f"cannot publish {self.branch} to {self.source}: {what}{said}"
        return PublishError(redact(text, self.secrets))


def _commit_message(title: str, body: str, copy: _WorkingCopy) -> tuple[str, str]:
    """The subject (the title on one line) and the whole commit message."""
    subject = " ".join(title.split())
    if not subject:
        raise copy.error("the title is empty; give the commit and pull request a title")
    body = body.strip()
    return subject, f"{subject}\n\n{body}\n" if body else f"{subject}\n"


def _check_branch_name(copy: _WorkingCopy) -> None:
    if run_git(["check-ref-format", f"refs/heads/{copy.branch}"]).returncode != 0:
        raise copy.error("that is not a valid branch name (see git check-ref-format)")


def _apply(copy: _WorkingCopy, commit: str, diff: bytes) -> str:
    """The tree of `commit` with `diff` applied (to the index only; binary patches too)."""
    flags = ["--cached", "--whitespace=nowarn"]
    result = copy.run("apply", *flags, "-", stdin=diff if diff.endswith(b"\n") else diff + b"\n")
    if result.returncode != 0:
        raise copy.error(f"the diff does not apply to commit {commit}", result)
    tree = copy.out("write-tree")
    if tree == copy.out("rev-parse", f"{commit}^{{tree}}"):
        raise copy.error(f"nothing to publish: the diff changes nothing in commit {commit}")
    return tree


def _checked(copy: _WorkingCopy, commit: str, policy: ChangePolicy) -> list[ChangedFile]:
    """The files the applied change touches, as git on this host reads them from the index;
    refused unless `policy` allows every one."""
    flags = ["--cached", "-z", "--no-renames", commit]
    raw = copy.run("diff-index", "--raw", *flags)
    numstat = copy.run("diff-index", "--numstat", *flags)
    if raw.returncode != 0 or numstat.returncode != 0:
        raise copy.error("cannot list the change's files", raw if raw.returncode else numstat)
    try:
        files = read_changes(raw.stdout, numstat.stdout, policy)
    except UnsafeChangeError as exc:
        raise copy.error(f"refused: {exc}") from None
    refusal = policy.refusal(files)
    if refusal is not None:
        raise copy.error(f"refused: {refusal}")
    return files


def _remote_head(copy: _WorkingCopy) -> str:
    """The commit `origin` holds on the branch, or "" when it has no such branch."""
    ref = f"refs/heads/{copy.branch}"
    listed = copy.out("ls-remote", "--refs", "origin", ref, network=True)
    for line in listed.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    return ""


def _has_content(copy: _WorkingCopy, commit: str, *, tree: str, parent: str, message: str) -> bool:
    """Whether `commit` (fetched from `origin` if need be) has this tree, parent and message."""
    if copy.run("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        fetch = ["fetch", "--quiet", "--no-tags", "origin", f"refs/heads/{copy.branch}"]
        fetched = copy.run(*fetch, network=True).returncode == 0
        if not fetched or copy.run("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return False  # the branch moved since ls-remote; the push's lease will catch it
    raw = copy.run("cat-file", "commit", commit).stdout.decode(errors="replace")
    headers, _, held = raw.partition("\n\n")
    fields = [tuple(line.split(" ", 1)) for line in headers.splitlines()]
    parents = [value for key, value in fields if key == "parent"]
    return ("tree", tree) in fields and parents == [parent] and held == message


def _push(copy: _WorkingCopy, fix: str, *, expected: str) -> None:
    """Push `fix` as the branch, only if `origin` still holds `expected` ("" = no branch)."""
    ref = f"refs/heads/{copy.branch}"
    lease = f"--force-with-lease={ref}:{expected}"
    result = copy.run(
        "push", "--quiet", "--no-verify", lease, "origin", f"{fix}:{ref}", network=True
    )
    if result.returncode == 0:
        return
    if "stale info" in git_said(result):
        raise copy.error(
            "the branch changed on the remote while publishing (someone else pushed to it); "
            "nothing was pushed, look at the branch before running the stage again",
            result,
        )
    raise copy.error("git push failed; check that this host may push to the repository", result)


def _fenced(
    copy: _WorkingCopy, fix: str, fence: Callable[[], None], *, pushed: bool, expected: str
) -> None:
    """Call `fence` after the push; if it raises, take back what this call pushed (the branch
    goes back to `expected`, or away) and let its exception go on."""
    try:
        fence()
    except BaseException:
        if pushed:
            _withdraw(copy, fix, back_to=expected)
        raise


def _withdraw(copy: _WorkingCopy, fix: str, *, back_to: str) -> None:
    """Undo a push of `fix`, only if `origin` still holds it: the branch returns to `back_to`
    ("" deletes it). A failure is logged, not raised: the fence's reason matters more."""
    ref = f"refs/heads/{copy.branch}"
    target = f"{back_to}:{ref}" if back_to else f":{ref}"
    result = copy.run(
        "push", "--quiet", "--no-verify", f"--force-with-lease={ref}:{fix}", "origin", target,
        network=True,
    )  # fmt: skip
    if result.returncode != 0:
        logger.warning("could not take back %s of %s: %s", copy.branch, redact(copy.source),
                       git_said(result))  # fmt: skip
    else:
        logger.info("took back %s of %s after the run was cancelled", copy.branch,
                    redact(copy.source))  # fmt: skip


def _github_said(exc: GithubException) -> str:
    """GitHub's message of an error response and the details it lists (422 has them)."""
    data = exc.data if isinstance(exc.data, dict) else {"message": str(exc.data)}
    details = [e.get("message", "") for e in data.get("errors", []) if isinstance(e, dict)]
    return "; ".join(str(part) for part in [data.get("message"), *details] if part)

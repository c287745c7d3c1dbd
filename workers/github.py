"""GitHub: recognising its remotes, letting git push to it with a token, opening pull requests.

The token is used on the worker host only. Git receives it as environment-based configuration
(an HTTP header for `https://github.com/` and nothing else), never in a URL or on a command
line; the REST API receives it through PyGithub. Errors come out as PyGithub's and requests'
own exceptions: the caller (`workers.publish`) turns them into messages without the token.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from github import Auth, Github, GithubException
from github.Repository import Repository
from pydantic import SecretStr

GITHUB_API_URL = "https://api.github.com"
"""The REST API of github.com, the default of `BATON_GITHUB_API_URL`; GitHub Enterprise and the
tests' fake server live elsewhere."""
API_TIMEOUT_S = 30
"""Time limit of one REST request."""
AUTH_HEADER_CONFIG = "http.https://github.com/.extraheader"
"""The git configuration key of an HTTP header sent to `https://github.com/` and nowhere else."""
_NAME = r"[A-Za-z0-9_.-]+"
_REMOTES = [
    # https://github.com/owner/repo(.git), possibly with user info before the host
    re.compile(rf"https://(?:[^/@]+@)?github\.com/({_NAME})/({_NAME})/?", re.IGNORECASE),
    # git@github.com:owner/repo.git
    re.compile(rf"[^/@:]+@github\.com:/?({_NAME})/({_NAME})/?", re.IGNORECASE),
    # ssh://git@github.com(:22)/owner/repo.git
    re.compile(rf"ssh://(?:[^/@]+@)?github\.com(?::\d+)?/({_NAME})/({_NAME})/?", re.IGNORECASE),
]


@dataclass(frozen=True)
class GitHubPacing:
    """How far apart REST requests are spaced. GitHub asks integrations to space their requests,
    writes most of all, to stay clear of its secondary rate limits; the defaults are PyGithub's
    own. A fake API in a test has no such limits to respect."""

    request_gap_s: float = 0.25
    """Least time from the end of one request to the start of the next."""
    write_gap_s: float = 1.0
    """Least time from the end of one writing request (not a GET) to the start of the next."""


GITHUB_PACING = GitHubPacing()
"""The pacing of requests to GitHub, PyGithub's."""


@dataclass(frozen=True)
class GitHubPullRequest:
    """A pull request as GitHub's API reports it, and whether this call opened it (not the pr
    stage's output, `orchestrator.pipelines.fixer.schemas.PullRequest`)."""

    number: int
    url: str
    created: bool


def github_slug(remote: str) -> str | None:
    """`owner/repo` of a github.com remote (https, scp-like or ssh URL); None for any other."""
    for pattern in _REMOTES:
        match = pattern.fullmatch(remote.strip())
        if match:
            owner, name = match.group(1), match.group(2).removesuffix(".git")
            return f"{owner}/{name}" if name and name not in (".", "..") else None
    return None


def is_github_https_remote(remote: str) -> bool:
    """Whether git reaches `remote` at `https://github.com/`, where the token header goes (an
    https remote on another host is not one)."""
    parts = urlsplit(remote.strip())
    return parts.scheme.lower() == "https" and (parts.hostname or "") == "github.com"


def git_auth_config(token: SecretStr) -> dict[str, str]:
    """Git configuration (`key: value`) that sends `token` to `https://github.com/` only.

    Put it into a git command's environment (`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`), so that
    it shows up neither in argv nor in a URL that git could echo.
    """
    basic = base64.b64encode(f"x-access-token:{token.get_secret_value()}".encode()).decode()
    return {AUTH_HEADER_CONFIG: f"AUTHORIZATION: basic {basic}"}


def secret_forms(token: SecretStr) -> list[str]:
    """Every form of `token` that could leak into text: as is, and inside the git header."""
    value = git_auth_config(token)[AUTH_HEADER_CONFIG]
    return [token.get_secret_value(), value.rsplit(" ", 1)[-1]]


class GitHubAPI:
    """GitHub's REST API at `api_url`, authenticated with `token` (no work until a call); it
    calls the API through PyGithub's `Github` client, its requests spaced by `pacing`."""

    def __init__(
        self,
        token: SecretStr,
        *,
        api_url: str = GITHUB_API_URL,
        pacing: GitHubPacing = GITHUB_PACING,
    ) -> None:
        self.token = token
        self.api_url = api_url
        self.pacing = pacing

    def open_pull_request(
        self, slug: str, *, branch: str, title: str, body: str, base: str | None = None
    ) -> GitHubPullRequest:
        """The pull request of `branch` into `base` (the default branch when None) of `slug`.

        An existing pull request from that branch, open or closed, is returned as it is; a new
        one is opened only when there is none. Raises `GithubException` and
        `requests.RequestException`.
        """
        auth = Auth.Token(self.token.get_secret_value())
        with Github(
            base_url=self.api_url,
            auth=auth,
            timeout=API_TIMEOUT_S,
            seconds_between_requests=self.pacing.request_gap_s,
            seconds_between_writes=self.pacing.write_gap_s,
        ) as client:
            repo = client.get_repo(slug)
            head = f"{slug.split('/')[0]}:{branch}"
            existing = _existing_pull(repo, head)
            if existing:
                return existing
            try:
                pull = repo.create_pull(
                    base=base or repo.default_branch, head=branch, title=title, body=body
                )
            except GithubException as exc:
                # 422: one was opened between the look and the create (a concurrent re-run).
                found = _existing_pull(repo, head) if exc.status == 422 else None
                if found:
                    return found
                raise
            return GitHubPullRequest(number=pull.number, url=pull.html_url, created=True)


def _existing_pull(repo: Repository, head: str) -> GitHubPullRequest | None:
    for pull in repo.get_pulls(state="all", head=head):
        return GitHubPullRequest(number=pull.number, url=pull.html_url, created=False)
    return None

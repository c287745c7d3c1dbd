"""The reviewer's host tool, `post_review`, against the fake GitHub holding the demo's pull
request: one review of the run's own pull request, comments on the lines the diff shows, the
rest moved into the body, posted once, and the token nowhere but in its header."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from demo.review import NAME, OWNER, ReviewRepo, make_review_repo, open_pull_request
from orchestrator.core.tools import HostTool, ToolRun
from orchestrator.pipelines.reviewer.github import GitHubError
from orchestrator.pipelines.reviewer.tools import post_review
from testkit.github import NOT_IN_DIFF, FakeGitHub
from workers.tools.host import host_tool
from workers.tools.secrets import Secrets

TOKEN = "ghp_test_0123456789abcdef"
BODY = "The threshold is off by one."
COMMENTS = [
    {"path": "shopcart/cart.py", "line": 39, "severity": "high", "text": "Use `>=`."},
    {"path": "shopcart/checkout.py", "line": 12, "severity": "medium", "text": "Average?"},
    {"path": "shopcart/cart.py", "line": 25, "severity": "low", "text": "Computed twice."},
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> ReviewRepo:
    return make_review_repo(tmp_path_factory.mktemp("review") / "shopcart.git")


@pytest.fixture
def github(repo: ReviewRepo) -> Iterator[FakeGitHub]:
    with FakeGitHub.start(token=TOKEN, owner=OWNER, name=NAME) as fake:
        open_pull_request(fake, repo)
        yield fake


def the_run(repo: ReviewRepo, **over: Any) -> ToolRun:
    values = {"run_id": "20261202-000000-abcdef", "pipeline": "reviewer", "stage": "review",
              "repo": str(repo.path), "commit": repo.head, "base": repo.base,
              "source": "pull_request", "source_id": f"{OWNER}/{NAME}#1", **over}  # fmt: skip
    return ToolRun.model_validate(values)


def post(github: FakeGitHub, run: ToolRun, token: str = TOKEN) -> dict[str, Any]:
    return asyncio.run(post_review(BODY, COMMENTS, run=run, token=SecretStr(token),  # type: ignore[arg-type]
                                   api_url=github.url))  # fmt: skip


def test_one_review_is_posted_with_comments_on_their_lines_and_the_rest_in_its_body(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    answer = post(github, the_run(repo))

    [review] = github.reviews[1]
    assert answer == {
        "posted": True, "already_posted": False, "review_id": review["id"],
        "url": f"https://github.com/{OWNER}/{NAME}/pull/1#pullrequestreview-{review['id']}",
        "comments_on_lines": 2,
        "moved_to_body": [{"path": "shopcart/cart.py", "line": 25, "reason":
                           "line 25 of shopcart/cart.py is not in the diff, which shows lines "
                           "2–11, 33–41 of it"}],
    }  # fmt: skip
    assert (review["state"], review["commit_id"]) == ("COMMENTED", repo.head)
    assert review["comments"] == [
        {"path": "shopcart/cart.py", "line": 39, "side": "RIGHT", "body": "**high**: Use `>=`."},
        {"path": "shopcart/checkout.py", "line": 12, "side": "RIGHT",
         "body": "**medium**: Average?"},
    ]  # fmt: skip
    assert review["body"].startswith(f"{BODY}\n\n**Comments on lines outside the diff**")
    assert (
        "- `shopcart/cart.py:25` **low**: Computed twice. _(moved here: line 25" in (review["body"])
    )
    assert review["body"].endswith("<!-- baton-review run=20261202-000000-abcdef -->")


def test_the_token_goes_in_the_authorization_header_and_nowhere_else(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    post(github, the_run(repo))

    assert {entry["authorization"] for entry in github.requests} == {f"Bearer {TOKEN}"}
    without_headers = [{k: v for k, v in e.items() if k != "authorization"}
                       for e in github.requests]  # fmt: skip
    assert TOKEN not in json.dumps(without_headers)


def test_posting_again_for_the_same_run_returns_the_review_already_posted(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    first = post(github, the_run(repo))
    again = post(github, the_run(repo))
    other_run = post(github, the_run(repo, run_id="20261202-000001-fedcba"))

    assert again == {"posted": True, "already_posted": True, "review_id": first["review_id"],
                     "url": first["url"]}  # fmt: skip
    assert other_run["review_id"] != first["review_id"]
    assert len(github.reviews[1]) == 2


def test_github_itself_refuses_a_review_with_a_comment_outside_the_diff(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    """Why the tool places the comments first: one stray comment loses the whole review."""
    stray = {"path": "shopcart/cart.py", "line": 25, "side": "RIGHT", "body": "x"}
    sent = {"commit_id": repo.head, "event": "COMMENT", "body": "b", "comments": [stray]}

    answer = httpx.post(f"{github.url}/repos/{OWNER}/{NAME}/pulls/1/reviews", json=sent,
                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip

    assert (answer.status_code, answer.json()["errors"]) == (422, [NOT_IN_DIFF])
    assert github.reviews[1] == []


def test_a_review_of_a_head_the_pull_request_has_moved_past_is_not_posted(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    with pytest.raises(GitHubError, match=f"the pull request's head is now {repo.head[:12]}, "
                       f"not {repo.base[:12]}, which this run reviewed"):  # fmt: skip
        post(github, the_run(repo, commit=repo.base))

    assert github.reviews[1] == []


@pytest.mark.parametrize(
    ("over", "said"),
    [
        ({"source": "sentry_event", "source_id": "e1"}, "its source is sentry_event, id e1"),
        ({"source_id": None}, "its source is pull_request, id none"),
    ],
)
def test_a_run_not_about_a_known_pull_request_posts_nothing(
    github: FakeGitHub, repo: ReviewRepo, over: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        post(github, the_run(repo, **over))

    assert github.requests == []


def test_a_refusal_names_the_request_and_quotes_github_without_the_token(
    github: FakeGitHub, repo: ReviewRepo
) -> None:
    with pytest.raises(GitHubError) as refused:
        post(github, the_run(repo), token="ghp_wrong_0123456789")

    assert str(refused.value) == (
        f"GET /repos/{OWNER}/{NAME}/pulls/1: GitHub answered 401: Bad credentials"
    )


def test_through_baton_the_model_reads_github_s_refusal_without_the_token(
    github: FakeGitHub, repo: ReviewRepo, tmp_path: Path
) -> None:
    """The fake quotes the token in its refusal, as a careless server might: Baton's redaction
    takes it out of the error the model reads."""
    github.refuse_review = 403
    declaration = HostTool(
        kind="host", function="orchestrator.pipelines.reviewer.tools:post_review",
        secrets={"token": "BATON_GITHUB_TOKEN"}, environment={"api_url": "BATON_GITHUB_API_URL"},
    )  # fmt: skip
    tool = host_tool(
        "post_review", declaration, stage="review", secrets=Secrets({"BATON_GITHUB_TOKEN": TOKEN}),
        environ={"BATON_GITHUB_API_URL": github.url}, run=the_run(repo),
    )  # fmt: skip

    answer = asyncio.run(tool.func(body=BODY, comments=COMMENTS))

    assert answer == {
        "error": f"post_review failed: GitHubError: POST /repos/{OWNER}/{NAME}/pulls/1/reviews: "
        "GitHub answered 403: token [secret BATON_GITHUB_TOKEN] may not review"
    }

"""The reviewer's host tool, `post_review`, against the fake GitHub holding the demo's pull
request: one review of the run's own pull request, comments on the lines the diff shows, the
rest moved into the body, posted once, and the token nowhere but in its header."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from demo.review import NAME, OWNER, ReviewRepo
from orchestrator.core.facts import Publication
from orchestrator.core.tools import ToolRun
from orchestrator.pipelines.reviewer.github import GitHubError
from orchestrator.pipelines.reviewer.tools import post_review
from testkit.github import NOT_IN_DIFF, FakeGitHub

from .conftest import TOKEN

Runs = Callable[..., ToolRun]

BODY = "The threshold is off by one."
COMMENTS = [
    {"path": "shopcart/cart.py", "line": 39, "severity": "high", "text": "Use `>=`."},
    {"path": "shopcart/checkout.py", "line": 12, "severity": "medium", "text": "Average?"},
    {"path": "shopcart/cart.py", "line": 25, "severity": "low", "text": "Computed twice."},
]


def post(github: FakeGitHub, run: ToolRun, token: str = TOKEN) -> dict[str, Any]:
    """The tool's answer as the model reads it (what it did not say left out)."""
    answer = asyncio.run(post_review(BODY, COMMENTS, run=run, token=SecretStr(token),  # type: ignore[arg-type]
                                     api_url=github.url))  # fmt: skip
    assert isinstance(answer, Publication)  # so Baton records where the review went
    return answer.model_dump(exclude_none=True)


def test_one_review_is_posted_with_comments_on_their_lines_and_the_rest_in_its_body(
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    answer = post(github, tool_run())

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
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    post(github, tool_run())

    assert {entry["authorization"] for entry in github.requests} == {f"Bearer {TOKEN}"}
    without_headers = [{k: v for k, v in e.items() if k != "authorization"}
                       for e in github.requests]  # fmt: skip
    assert TOKEN not in json.dumps(without_headers)


def test_posting_again_for_the_same_run_returns_the_review_already_posted(
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    first = post(github, tool_run())
    again = post(github, tool_run())
    other_run = post(github, tool_run(run_id="20261202-000001-fedcba"))

    assert again == {"posted": True, "already_posted": True, "review_id": first["review_id"],
                     "url": first["url"]}  # fmt: skip
    assert other_run["review_id"] != first["review_id"]
    assert len(github.reviews[1]) == 2


def test_github_itself_refuses_a_review_with_a_comment_outside_the_diff(
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    """Why the tool places the comments first: one stray comment loses the whole review."""
    stray = {"path": "shopcart/cart.py", "line": 25, "side": "RIGHT", "body": "x"}
    sent = {"commit_id": repo.head, "event": "COMMENT", "body": "b", "comments": [stray]}

    answer = httpx.post(f"{github.url}/repos/{OWNER}/{NAME}/pulls/1/reviews", json=sent,
                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip

    assert (answer.status_code, answer.json()["errors"]) == (422, [NOT_IN_DIFF])
    assert github.reviews[1] == []


def test_a_review_of_a_head_the_pull_request_has_moved_past_is_not_posted(
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    with pytest.raises(GitHubError, match=f"the pull request's head is now {repo.head[:12]}, "
                       f"not {repo.base[:12]}, which this run reviewed"):  # fmt: skip
        post(github, tool_run(commit=repo.base))

    assert github.reviews[1] == []


@pytest.mark.parametrize(
    ("over", "said"),
    [
        ({"source": "sentry_event", "source_id": "e1"}, "its source is sentry_event, id e1"),
        ({"source_id": None}, "its source is pull_request, id none"),
    ],
)
def test_a_run_not_about_a_known_pull_request_posts_nothing(
    github: FakeGitHub, tool_run: Runs, over: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        post(github, tool_run(**over))

    assert github.requests == []


def test_a_refusal_names_the_request_and_quotes_github_without_the_token(
    github: FakeGitHub, repo: ReviewRepo, tool_run: Runs
) -> None:
    with pytest.raises(GitHubError) as refused:
        post(github, tool_run(), token="ghp_wrong_0123456789")

    assert str(refused.value) == (
        f"GET /repos/{OWNER}/{NAME}/pulls/1: GitHub answered 401: Bad credentials"
    )

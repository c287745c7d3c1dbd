"""The reviewer's host tool: `post_review`, which posts the review stage's comments as one
GitHub review of the pull request under review.

Declared in the pipeline's spec as a host tool (docs/pipelines.md, "Host tools"): Baton gives it
the run (`ToolRun`: which pull request, which head commit), the token from the worker's
environment (`BATON_GITHUB_TOKEN`, a declared secret: never in a prompt, a log line or an
artifact) and the API's address (`BATON_GITHUB_API_URL`); the model gives only the review's
text and its comments. So the review goes to the run's own pull request whatever a prompt
talks the model into, and it is only ever a comment: the tool never approves or requests
changes, which is a person's decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, SecretStr, TypeAdapter

from orchestrator.core.facts import Publication
from orchestrator.core.tools import ToolRun
from orchestrator.pipelines.reviewer.diff import comment_text, place_comments, review_body
from orchestrator.pipelines.reviewer.github import GITHUB_API_URL, GitHubClient, GitHubError
from orchestrator.pipelines.reviewer.schemas import ReviewComment

REVIEW_EVENT = "COMMENT"
"""What every review the tool posts is: a comment, never an approval or a change request."""
MARKER = "<!-- baton-review run={run_id} -->"
"""Ends the body of every review the tool posts: a run that posts again finds its review."""
_PULL_REQUEST = re.compile(r"^([\w.-]+)/([\w.-]+)#(\d+)$")
_COMMENTS = TypeAdapter(list[ReviewComment])


class MovedComment(BaseModel):
    """A comment that could not sit on its line, so it went into the review's body."""

    path: str
    line: int
    reason: str


class PostedReview(Publication):
    """What `post_review` answers. A `Publication`, so Baton records its `url` as where the
    run's result went (`status` and `watch` show it; the review stage's `review_url`)."""

    posted: bool = True
    already_posted: bool
    review_id: int | None
    comments_on_lines: int | None = None
    """How many comments sit on their lines; None when the review was posted before."""
    moved_to_body: list[MovedComment] | None = None


@dataclass(frozen=True)
class PullTarget:
    """The pull request a run reviews, from the run's source id (`owner/repo#number`)."""

    owner: str
    repo: str
    number: int

    @classmethod
    def of(cls, run: ToolRun) -> PullTarget:
        """Raises `ValueError` when the run is not about a pull request GitHub knows."""
        match = _PULL_REQUEST.match(run.source_id or "")
        if run.source != "pull_request" or match is None:
            raise ValueError(
                f"run {run.run_id} is not about a GitHub pull request (its source is "
                f"{run.source}, id {run.source_id or 'none'}); enqueue the pull request itself, "
                "with its repository, to post a review"
            )
        return cls(match.group(1), match.group(2), int(match.group(3)))

    @property
    def path(self) -> str:
        return f"/repos/{self.owner}/{self.repo}/pulls/{self.number}"


async def post_review(
    body: str,
    comments: list[ReviewComment],
    *,
    run: ToolRun,
    token: SecretStr,
    api_url: str = GITHUB_API_URL,
) -> PostedReview:
    """Post the review to the pull request under review, as one GitHub review: the body, and
    each comment on its line. A comment on a line the pull request's diff does not show cannot
    sit there: it is moved into the body, and the answer lists it with the reason. Posting again
    posts nothing new: the review this run posted already is returned.

    Args:
        body: The review's summary: the verdict and why, in a few sentences.
        comments: Each comment: path (relative to the repository root), line (in the head's
            version of the file, a line the diff shows), severity (low, medium, high,
            critical) and text.
    """
    target = PullTarget.of(run)
    wanted = _COMMENTS.validate_python(comments)
    marker = MARKER.format(run_id=run.run_id)
    async with GitHubClient.open(api_url, token) as github:
        pull = await github.get(target.path)
        head = (pull.get("head") or {}).get("sha")
        if head != run.commit:
            raise GitHubError(
                f"the pull request's head is now {str(head)[:12]}, not {run.commit[:12]}, "
                "which this run reviewed: a review of an older commit is not posted"
            )
        found = await _posted(github, target, marker)
        if found is not None:
            return _answer(found, placed=None, moved=[], already=True)
        files = await github.pages(f"{target.path}/files")
        patches = {item["filename"]: item.get("patch") for item in files}
        placed, moved = place_comments(wanted, patches)
        review = await github.post(
            f"{target.path}/reviews",
            {
                "commit_id": run.commit,
                "event": REVIEW_EVENT,
                "body": review_body(body, moved, marker),
                "comments": [
                    {"path": c.path, "line": c.line, "side": "RIGHT", "body": comment_text(c)}
                    for c in placed
                ],
            },
        )
    return _answer(review, placed=len(placed), moved=moved, already=False)


async def _posted(github: GitHubClient, target: PullTarget, marker: str) -> Any | None:
    """The review this run posted before (its body ends with `marker`), if any."""
    for review in await github.pages(f"{target.path}/reviews"):
        if isinstance(review, dict) and marker in str(review.get("body") or ""):
            return review
    return None


def _answer(
    review: dict[str, Any], *, placed: int | None, moved: list[Any], already: bool
) -> PostedReview:
    return PostedReview(
        url=str(review.get("html_url") or ""),
        already_posted=already,
        review_id=review.get("id"),
        comments_on_lines=placed,
        moved_to_body=None
        if placed is None
        else [
            MovedComment(path=m.comment.path, line=m.comment.line, reason=m.reason) for m in moved
        ],
    )

"""A fake of the GitHub REST API: the endpoints PyGithub calls to find and open pull requests,
and those a reviewer calls to read a pull request (`GET …/pulls/{number}`, its `files`, its
`reviews`) and to post a review (`POST …/pulls/{number}/reviews`), in GitHub's shapes.

Ships beside the fake Gemini server so that publishing and reviewing are tested against real
clients. A pull request to review is added with its files (`add_pull(..., files=...)`;
`testkit.pulls.pull_files` makes them from a git repository); a review whose comment is on a
line the pull request's diff does not show is refused with GitHub's 422, read from the hunks'
headers, independently of any client's own check.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from testkit.gemini.harness import serve_in_thread

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
NOT_IN_DIFF = (
    "Pull request review thread line must be part of the diff and Pull request review thread "
    "diff hunk can't be blank"
)
"""What GitHub says of a review comment on a line its diff does not show."""
REFUSALS: dict[int, dict[str, Any]] = {
    401: {"message": "Bad credentials"},
    403: {"message": "Resource not accessible by integration"},
    422: {"message": "Unprocessable Entity", "errors": [NOT_IN_DIFF]},
}
"""GitHub's answers to a review it refuses, by status (`refuse_review`)."""
REVIEW_STATES = {"COMMENT": "COMMENTED", "APPROVE": "APPROVED",
                 "REQUEST_CHANGES": "CHANGES_REQUESTED", None: "PENDING"}  # fmt: skip


class FakeGitHub:
    """The REST endpoints PyGithub calls to find and open pull requests, and a reviewer's, on a
    free local port.

    Requests without `Authorization: token TOKEN` (or `Bearer TOKEN`) get 401, like GitHub's.
    `refuse_create` makes the next pull request creation fail with that status, and
    `refuse_review` every review, with GitHub's answer for that status (`REFUSALS`), each answer
    quoting the token as a careless server might;
    `stale_lists` hides existing pull requests from that many list requests (GitHub's lists lag
    behind its writes). `reviews` holds every review posted, by pull request number, with its
    comments.
    """

    def __init__(
        self,
        *,
        token: str,
        owner: str = "octo",
        name: str = "widgets",
        default_branch: str = "develop",
    ) -> None:
        self.url = ""
        self.token, self.owner, self.name = token, owner, name
        self.default_branch = default_branch
        self.requests: list[dict[str, Any]] = []
        self.pulls: list[dict[str, Any]] = []
        self.files: dict[int, list[dict[str, Any]]] = {}
        self.reviews: dict[int, list[dict[str, Any]]] = {}
        self.refuse_create: int | None = None
        self.refuse_review: int | None = None
        self.stale_lists = 0
        pull = "/repos/{owner}/{name}/pulls/{number:int}"
        self.app = Starlette(
            routes=[
                Route("/repos/{owner}/{name}", self.repo, methods=["GET"]),
                Route("/repos/{owner}/{name}/pulls", self.list_pulls, methods=["GET"]),
                Route("/repos/{owner}/{name}/pulls", self.create_pull, methods=["POST"]),
                Route(pull, self.get_pull, methods=["GET"]),
                Route(f"{pull}/files", self.list_files, methods=["GET"]),
                Route(f"{pull}/reviews", self.list_reviews, methods=["GET"]),
                Route(f"{pull}/reviews", self.create_review, methods=["POST"]),
            ]
        )

    def posts(self) -> list[dict[str, Any]]:
        return [entry["json"] for entry in self.requests if entry["method"] == "POST"]

    async def _record(self, request: Request) -> JSONResponse | None:
        body = await request.body()
        self.requests.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": dict(request.query_params),
                "json": await request.json() if body else None,
                "authorization": request.headers.get("authorization"),
            }
        )
        if request.headers.get("authorization") not in (f"token {self.token}",
                                                        f"Bearer {self.token}"):  # fmt: skip
            return JSONResponse({"message": "Bad credentials"}, status_code=401)
        if (request.path_params["owner"], request.path_params["name"]) != (self.owner, self.name):
            return JSONResponse({"message": "Not Found"}, status_code=404)
        return None

    async def repo(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        return refused or JSONResponse(
            {
                "id": 1,
                "name": self.name,
                "full_name": f"{self.owner}/{self.name}",
                "owner": {"login": self.owner},
                "url": f"{self.url}/repos/{self.owner}/{self.name}",
                "html_url": f"https://github.com/{self.owner}/{self.name}",
                "default_branch": self.default_branch,
            }
        )

    async def list_pulls(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        if refused:
            return refused
        if self.stale_lists:
            self.stale_lists -= 1
            return JSONResponse([])
        head, state = request.query_params.get("head"), request.query_params.get("state", "open")
        found = [
            pull
            for pull in self.pulls
            if pull["head"]["label"] == head and state in ("all", pull["state"])
        ]
        return JSONResponse(found)

    async def create_pull(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        if refused:
            return refused
        if self.refuse_create:
            leaky = [{"message": f"token {self.token} may not write pull requests"}]
            refusal = {"message": "Resource not accessible by integration", "errors": leaky}
            return JSONResponse(refusal, status_code=self.refuse_create)
        sent = await request.json()
        label = f"{self.owner}:{sent['head']}"
        if any(pull["head"]["label"] == label and pull["state"] == "open" for pull in self.pulls):
            errors = [{"message": f"A pull request already exists for {label}."}]
            return JSONResponse({"message": "Validation Failed", "errors": errors}, 422)
        return JSONResponse(self.add_pull(sent["head"], sent["base"], sent["title"]), 201)

    def add_pull(
        self,
        head: str,
        base: str,
        title: str,
        *,
        head_sha: str | None = None,
        base_sha: str | None = None,
        body: str | None = None,
        files: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """Open a pull request of branch `head` into `base`: its commits, description and
        changed files (GitHub's shape: `filename`, `status`, `patch`, …) if given."""
        number = len(self.pulls) + 1
        full_name = f"{self.owner}/{self.name}"
        pull = {
            "number": number,
            "state": "open",
            "title": title,
            "body": body,
            "user": {"login": "octocat"},
            "url": f"{self.url}/repos/{full_name}/pulls/{number}",
            "html_url": f"https://github.com/{full_name}/pull/{number}",
            "head": {"ref": head, "label": f"{self.owner}:{head}", "sha": head_sha},
            "base": {
                "ref": base,
                "label": f"{self.owner}:{base}",
                "sha": base_sha,
                "repo": {"full_name": full_name},
            },
        }
        self.pulls.append(pull)
        self.files[number] = [dict(item) for item in files]
        self.reviews[number] = []
        return pull

    def _pull(self, request: Request) -> dict[str, Any] | None:
        number = request.path_params["number"]
        return self.pulls[number - 1] if 0 < number <= len(self.pulls) else None

    async def get_pull(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        pull = self._pull(request)
        return refused or (JSONResponse(pull) if pull else _not_found())

    async def list_files(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        if refused or self._pull(request) is None:
            return refused or _not_found()
        return JSONResponse(_page(request, self.files[request.path_params["number"]]))

    async def list_reviews(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        if refused or self._pull(request) is None:
            return refused or _not_found()
        reviews = self.reviews[request.path_params["number"]]
        shown = [{k: v for k, v in review.items() if k != "comments"} for review in reviews]
        return JSONResponse(_page(request, shown))

    async def create_review(self, request: Request) -> JSONResponse:
        refused = await self._record(request)
        pull = self._pull(request)
        if refused or pull is None:
            return refused or _not_found()
        if self.refuse_review:
            shape = REFUSALS.get(self.refuse_review, {"message": "Refused"})
            refusal = {**shape, "errors": [*shape.get("errors", []), f"(token {self.token})"]}
            return JSONResponse(refusal, status_code=self.refuse_review)
        sent = await request.json()
        event = sent.get("event")
        if event not in REVIEW_STATES:
            return _unprocessable([f"event {event!r} is not one of COMMENT, APPROVE, "
                                   "REQUEST_CHANGES"])  # fmt: skip
        lines = {
            item["filename"]: _right_lines(item.get("patch") or "")
            for item in self.files[pull["number"]]
        }
        for comment in sent.get("comments") or []:
            side = comment.get("side", "RIGHT")
            if side != "RIGHT" or comment.get("line") not in lines.get(comment.get("path"), ()):
                return _unprocessable([NOT_IN_DIFF])
        reviews = self.reviews[pull["number"]]
        review_id = 80 + sum(len(found) for found in self.reviews.values()) + 1
        review = {
            "id": review_id,
            "node_id": f"PRR_{review_id}",
            "user": {"login": "baton-bot"},
            "body": sent.get("body") or "",
            "state": REVIEW_STATES[event],
            "html_url": f"{pull['html_url']}#pullrequestreview-{review_id}",
            "pull_request_url": pull["url"],
            "commit_id": sent.get("commit_id") or pull["head"]["sha"],
            "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "comments": list(sent.get("comments") or []),
        }
        reviews.append(review)
        return JSONResponse({k: v for k, v in review.items() if k != "comments"})

    @classmethod
    @contextmanager
    def start(cls, **kwargs: Any) -> Iterator[FakeGitHub]:
        """Serve a fake from a thread on a free port until the block ends."""
        fake = cls(**kwargs)
        with serve_in_thread(fake.app, "fake GitHub") as url:
            fake.url = url
            yield fake


def _right_lines(patch: str) -> set[int]:
    """The head's lines a patch shows: every new-side line of every hunk is added or context."""
    lines: set[int] = set()
    for hunk in _HUNK.finditer(patch):
        start, count = int(hunk.group(1)), int(hunk.group(2) or 1)
        lines.update(range(start, start + count))
    return lines


def _page(request: Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page of `items` the request asks for (`per_page`, default 30; `page`, from 1)."""
    per_page = min(int(request.query_params.get("per_page", 30)), 100)
    page = int(request.query_params.get("page", 1))
    return items[(page - 1) * per_page : page * per_page]


def _not_found() -> JSONResponse:
    return JSONResponse({"message": "Not Found"}, status_code=404)


def _unprocessable(errors: list[str]) -> JSONResponse:
    body = {"message": "Unprocessable Entity", "errors": errors,
            "documentation_url": "https://docs.github.com/rest/pulls/reviews"}  # fmt: skip
    return JSONResponse(body, status_code=422)

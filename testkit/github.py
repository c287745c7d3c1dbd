"""A fake of the GitHub REST API: the endpoints PyGithub calls to find and open pull requests.

Ships beside the fake Gemini server so that publishing is tested against the real client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from testkit.gemini.harness import serve_in_thread


class FakeGitHub:
    """The REST endpoints PyGithub calls to find and open pull requests, on a free local port.

    Requests without `Authorization: token TOKEN` get 401, like GitHub's. `refuse_create`
    makes the next pull request creation fail with that status; `stale_lists` hides existing
    pull requests from that many list requests (GitHub's lists lag behind its writes).
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
        self.refuse_create: int | None = None
        self.stale_lists = 0
        self.app = Starlette(
            routes=[
                Route("/repos/{owner}/{name}", self.repo, methods=["GET"]),
                Route("/repos/{owner}/{name}/pulls", self.list_pulls, methods=["GET"]),
                Route("/repos/{owner}/{name}/pulls", self.create_pull, methods=["POST"]),
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
        if request.headers.get("authorization") != f"token {self.token}":
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

    def add_pull(self, head: str, base: str, title: str) -> dict[str, Any]:
        number = len(self.pulls) + 1
        pull = {
            "number": number,
            "state": "open",
            "title": title,
            "url": f"{self.url}/repos/{self.owner}/{self.name}/pulls/{number}",
            "html_url": f"https://github.com/{self.owner}/{self.name}/pull/{number}",
            "head": {"ref": head, "label": f"{self.owner}:{head}"},
            "base": {"ref": base, "label": f"{self.owner}:{base}"},
        }
        self.pulls.append(pull)
        return pull

    @classmethod
    @contextmanager
    def start(cls, **kwargs: Any) -> Iterator[FakeGitHub]:
        """Serve a fake from a thread on a free port until the block ends."""
        fake = cls(**kwargs)
        with serve_in_thread(fake.app, "fake GitHub") as url:
            fake.url = url
            yield fake

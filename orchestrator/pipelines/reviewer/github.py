"""The few GitHub REST calls the reviewer makes, with httpx: read a pull request, its files and
its reviews, and create a review.

The token goes in the `Authorization` header and nowhere else; GitHub's refusals become a
`GitHubError` quoting GitHub's own message and the request's method and path, never a header.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from pydantic import SecretStr

GITHUB_API_URL = "https://api.github.com"
"""github.com's REST API; GitHub Enterprise and the tests' fake live elsewhere
(`BATON_GITHUB_API_URL`)."""
API_VERSION = "2022-11-28"
REQUEST_TIMEOUT_S = 30.0
PER_PAGE = 100
MAX_PAGES = 30
"""GitHub lists at most 3,000 files of a pull request: 30 pages of 100."""
MAX_MESSAGE_CHARS = 500


class GitHubError(RuntimeError):
    """Raised when GitHub refuses a request or cannot be reached; the message names the request
    (method and path) and quotes GitHub."""


class GitHubClient:
    """GitHub's REST API for one token, over one httpx client."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    @classmethod
    @asynccontextmanager
    async def open(cls, api_url: str, token: SecretStr) -> AsyncIterator[GitHubClient]:
        """A client of the API at `api_url`, authenticated with `token`, closed afterwards."""
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {token.get_secret_value()}",
            "User-Agent": "baton-reviewer",
            "X-GitHub-Api-Version": API_VERSION,
        }
        async with httpx.AsyncClient(
            base_url=api_url.rstrip("/"), headers=headers, timeout=REQUEST_TIMEOUT_S
        ) as client:
            yield cls(client)

    async def get(self, path: str, **params: Any) -> Any:
        return await self._request("GET", path, params=params)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", path, json=body)

    async def pages(self, path: str) -> list[Any]:
        """Every item of a list endpoint, page after page, up to `MAX_PAGES`."""
        items: list[Any] = []
        for page in range(1, MAX_PAGES + 1):
            found = await self.get(path, per_page=PER_PAGE, page=page)
            if not isinstance(found, list):
                raise GitHubError(f"GET {path} answered {type(found).__name__}, not a list")
            items += found
            if len(found) < PER_PAGE:
                break
        return items

    async def _request(self, method: str, path: str, **options: Any) -> Any:
        try:
            response = await self._client.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise GitHubError(f"{method} {path}: GitHub could not be reached: "
                              f"{type(exc).__name__}") from None  # fmt: skip
        if response.status_code >= 400:
            raise GitHubError(f"{method} {path}: GitHub answered {response.status_code}: "
                              f"{_said(response)}")  # fmt: skip
        try:
            return response.json()
        except ValueError:
            raise GitHubError(f"{method} {path}: GitHub's answer is not JSON") from None


def _said(response: httpx.Response) -> str:
    """GitHub's message and errors, from its JSON error body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:MAX_MESSAGE_CHARS] or response.reason_phrase
    if not isinstance(body, dict):
        return str(body)[:MAX_MESSAGE_CHARS]
    said = str(body.get("message") or response.reason_phrase)
    errors = body.get("errors")
    if isinstance(errors, list) and errors:
        details = [e.get("message", e) if isinstance(e, dict) else e for e in errors]
        said += ": " + "; ".join(map(str, details))
    return said[:MAX_MESSAGE_CHARS]

"""Where a stage's result went is a fact Baton records, whoever published it: the built-in
`publish` tool (a pull request's page) or a host tool that returns a `Publication` (a posted
review's page); the stage's output holds it at the field its schema marks for it."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.core.facts import Fact, Publication
from orchestrator.core.tools import HostTool
from workers.tools.host import host_tool
from workers.tools.secrets import Secrets

TOKEN = "tok-0123456789abcdef"


def post_note(text: str, *, token: str) -> Publication:
    """Posts a note; says where it is (with the token in its URL, as a careless API might)."""
    return Publication(url=f"https://notes.example/n/7?auth={token}")


def post_plain(text: str) -> dict[str, Any]:
    """Posts a note; says where in a plain dict, which is no fact."""
    return {"url": "https://notes.example/n/8"}


def _run(function: str, record: dict[Fact, Any]) -> Any:
    declaration = HostTool(
        kind="host",
        function=f"{__name__}:{function}",
        secrets={"token": "TOKEN"} if function == "post_note" else {},
    )
    tool = host_tool(
        function, declaration, stage="review", secrets=Secrets({"TOKEN": TOKEN}),
        record=record.__setitem__,
    )  # fmt: skip
    return asyncio.run(tool.func(text="looks good"))


def test_a_host_tool_that_returns_a_publication_records_where_without_its_secrets() -> None:
    facts: dict[Fact, Any] = {}

    answer = _run("post_note", facts)

    assert facts == {Fact.PUBLISHED_URL: "https://notes.example/n/7?auth=[secret TOKEN]"}
    assert answer == {"url": "https://notes.example/n/7?auth=[secret TOKEN]"}


def test_a_plain_result_records_nothing() -> None:
    facts: dict[Fact, Any] = {}

    assert _run("post_plain", facts) == {"url": "https://notes.example/n/8"}
    assert facts == {}

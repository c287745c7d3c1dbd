"""`post_review` as a review stage's worker opens it: from the reviewer's own spec, its token read
from the worker's environment by the name the spec declares, and every refusal of GitHub's a
tool error the model reads, without the token."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from demo.review import NAME, OWNER
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.tools import ToolRun
from orchestrator.pipelines.reviewer import SPEC
from testkit.github import NOT_IN_DIFF, FakeGitHub
from workers.errors import StageError
from workers.tools.declared import ToolBench, open_toolbox

from .conftest import TOKEN

TOKEN_VARIABLE = "BATON_GITHUB_TOKEN"
"""The variable the reviewer's spec names for the token (written here, not read from it)."""
PULL = f"/repos/{OWNER}/{NAME}/pulls/1"
COMMENTS = [
    {"path": "shopcart/cart.py", "line": 39, "severity": "high", "text": "Use `>=`."},
    {"path": "shopcart/cart.py", "line": 25, "severity": "low", "text": "Computed twice."},
]


def call_post_review(environ: Mapping[str, str], run: ToolRun) -> dict[str, Any]:
    """Open the review stage's tools as its worker does, and have the model call post_review."""
    declarations = load_pipeline(str(SPEC)).tools

    async def go() -> dict[str, Any]:
        bench = ToolBench(stage="review", environ=environ, run=run)
        async with open_toolbox(["post_review"], declarations, bench) as toolbox:
            [tool] = toolbox.tools
            said = await tool.run_async(  # type: ignore[attr-defined]
                args={"body": "Off by one.", "comments": COMMENTS}, tool_context=None
            )
            return toolbox.review(tool, said)

    return asyncio.run(go())


def worker_environ(github: FakeGitHub, token: str = TOKEN) -> dict[str, str]:
    return {TOKEN_VARIABLE: token, "BATON_GITHUB_API_URL": github.url,
            "GITHUB_TOKEN": "ghp_not_the_declared_variable"}  # fmt: skip


def test_the_token_is_the_worker_s_variable_the_spec_names(
    github: FakeGitHub, tool_run: Callable[..., ToolRun]
) -> None:
    answer = call_post_review(worker_environ(github), tool_run())

    assert (answer["posted"], answer["comments_on_lines"]) == (True, 1)
    assert answer["moved_to_body"][0]["reason"].startswith("line 25 of shopcart/cart.py is not")
    assert {entry["authorization"] for entry in github.requests} == {f"Bearer {TOKEN}"}
    assert [review["comments"][0]["line"] for review in github.reviews[1]] == [39]


def test_without_the_named_variable_the_stage_fails_naming_it_and_nothing_is_sent(
    github: FakeGitHub, tool_run: Callable[..., ToolRun]
) -> None:
    environ = {k: v for k, v in worker_environ(github).items() if k != TOKEN_VARIABLE}

    with pytest.raises(StageError, match=f"needs the secret {TOKEN_VARIABLE}, which is not set"):
        call_post_review(environ, tool_run())

    assert github.requests == []


@pytest.mark.parametrize(
    ("refuse_review", "token", "error"),
    [
        (None, "ghp_revoked_0123456789", f"GET {PULL}: GitHub answered 401: Bad credentials"),
        (401, TOKEN, f"POST {PULL}/reviews: GitHub answered 401: Bad credentials: (token "
                     f"[secret {TOKEN_VARIABLE}])"),
        (422, TOKEN, f"POST {PULL}/reviews: GitHub answered 422: Unprocessable Entity: "
                     f"{NOT_IN_DIFF}; (token [secret {TOKEN_VARIABLE}])"),
    ],
    ids=["401-revoked-token", "401-on-review", "422"],
)  # fmt: skip
def test_a_refusal_is_a_tool_error_the_model_reads_without_the_token(
    github: FakeGitHub,
    tool_run: Callable[..., ToolRun],
    caplog: pytest.LogCaptureFixture,
    refuse_review: int | None,
    token: str,
    error: str,
) -> None:
    """The fake quotes the token in its refusals, as a careless server might: Baton's redaction
    takes it out of what the model reads."""
    github.refuse_review = refuse_review
    caplog.set_level(logging.DEBUG)

    answer = call_post_review(worker_environ(github, token), tool_run())

    assert answer == {"error": f"post_review failed: GitHubError: {error}"}
    assert github.reviews[1] == []
    assert TOKEN not in caplog.text and token not in caplog.text
    without_headers = [{k: v for k, v in e.items() if k != "authorization"}
                       for e in github.requests]  # fmt: skip
    assert token not in json.dumps(without_headers)

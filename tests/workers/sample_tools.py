"""Host tools the tests of declared tools name by import path (`tests.workers.sample_tools:…`),
well made and not: what a pipeline author might write."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import BaseModel, SecretStr

from orchestrator.core.tools import ToolModel, ToolRun


class Owner(BaseModel):
    team: str
    reviewers: list[str]


def lookup_owner(path: str, *, token: str, team: str = "core", region: str) -> dict[str, Any]:
    """The team that owns a file of the repository, from the owners service.

    Args:
        path: File, relative to the repository root.
    """
    # Echoes the token, as a careless service might: it must not reach the model.
    return {"path": path, "team": f"{team}@{region}", "auth": f"Bearer {token}"}


def owner_model(path: str) -> Owner:
    """The owner of a file, as a model."""
    return Owner(team="core", reviewers=["ana", path])


def refuse(path: str, *, token: SecretStr) -> dict[str, Any]:
    """Always fails, naming its secret in the error."""
    raise PermissionError(f"the owners service refused token {token.get_secret_value()}")


def nap(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "awake"


async def summarize(text: str, style: Literal["short", "long"], model: ToolModel) -> str:
    """Summarizes a text with the stage's model."""
    return await model.generate(f"Summarize ({style}): {text}", system="You summarize.")


def summarize_in_thread(text: str, model: ToolModel) -> str:
    """Summarizes a text with the stage's model, from a plain function."""
    return model.generate_sync(f"Summarize: {text}")


async def wait_forever(note: str) -> str:
    """Never returns."""
    await asyncio.sleep(3600)
    return note


def untyped(path):  # type: ignore[no-untyped-def]
    """No annotations at all."""
    return path


def no_return(path: str):  # type: ignore[no-untyped-def]
    """No return annotation."""
    return path


def star(*paths: str) -> str:
    """Takes *args."""
    return ",".join(paths)


def undocumented(path: str) -> str:
    return path


def with_context(path: str, tool_context: Any) -> str:
    """Asks for ADK's context."""
    return path


def generator(path: str) -> Any:
    """A generator, not a function that returns."""
    yield path


NOT_A_FUNCTION = 42


def stopped(path: str) -> str:
    """Raises what a cancelled run raises at a safe point."""
    from workers.errors import StageCancelledError

    raise StageCancelledError()


def where_am_i(
    question: str, *, run: ToolRun, region: str, api_url: str = "https://owners.example"
) -> dict[str, Any]:
    """The run a tool serves and the service it reaches."""
    return {"question": question, "run": run.run_id, "source_id": run.source_id,
            "repo": run.repo, "region": region, "api_url": api_url}  # fmt: skip

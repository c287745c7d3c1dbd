"""A Baton agent (`build_agent` + `StageSession`) on the fake Gemini server, which checks thought
signatures the way Gemini 3 does: whatever Baton trims from a request to fit its token budget,
every call it keeps goes back with the signature the model gave it, and a second turn in the
same session (the repair turn) is accepted too."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.core.rules import StageBudget
from orchestrator.core.settings import ModelConfig, RetryConfig
from testkit.gemini import FakeGemini
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.gemini import build_model, close_model

PATHS = [f"shop/module_{n}.py" for n in range(6)]
ROOT_CAUSE = {"root_cause": "cents are divided twice"}
SCENARIO: dict[str, Any] = {
    "agents": {
        "search": [
            *({"call": {"name": "read_file", "args": {"path": path}}} for path in PATHS),
            {"json": ROOT_CAUSE},
        ]
    }
}
FILE_CHARS = 3_000
"""Each file read is about 750 tokens, so a budget of 2,000 keeps about two of them."""
MAX_REQUEST_TOKENS = 2_000
TRIMMED = "[Baton: left out "


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGemini]:
    with FakeGemini.start(SCENARIO) as server:
        yield server


def read_file(path: str) -> dict[str, Any]:
    """Read a file of the repository.

    Args:
        path: File, relative to the repository root.
    """
    return {"path": path, "content": path[-1] * FILE_CHARS}


def run_stage(
    fake: FakeGemini, messages: list[str], *, streaming: bool
) -> tuple[list[str], list[dict[str, Any]]]:
    """One `search` stage session with a small request budget, one turn per message; the
    replies and the audit entries."""
    fake.reset()
    audit: list[dict[str, Any]] = []
    spec = AgentSpec(
        name="search",
        instruction="Find the root cause.",
        contract="Reply with JSON.",
        budget=StageBudget(max_request_tokens=MAX_REQUEST_TOKENS),
        tools=[read_file],
    )

    async def run() -> list[str]:
        model = build_model(ModelConfig(base_url=fake.url, api_key=SecretStr("k")), RetryConfig())
        usage = Usage()
        try:
            async with StageSession.open(
                build_agent(spec, model, usage),
                session_id="run:search:1",
                state={},
                audit=audit.extend,
                labels={"stage": "search"},
                usage=usage,
                streaming=streaming,
            ) as session:
                return [await session.turn(text, max_model_calls=20) for text in messages]
        finally:
            await close_model(model)

    return asyncio.run(run()), audit


def received_signatures(audit: list[dict[str, Any]]) -> dict[str, bytes]:
    """The signature the model gave each call, by the path it reads, as Baton audited it."""
    found = {}
    for entry in audit:
        if entry["kind"] != "tool_call":
            continue
        [part] = json.loads(entry["data"])["content"]["parts"]
        found[part["function_call"]["args"]["path"]] = decoded(part["thought_signature"])
    return found


def sent_signatures(request: dict[str, Any]) -> dict[str, bytes | None]:
    """The signature each call in a recorded request carries, by the path it reads."""
    return {
        part["functionCall"]["args"]["path"]: decoded(part.get("thoughtSignature"))
        for content in request["contents"]
        for part in content["parts"]
        if "functionCall" in part
    }


def decoded(signature: str | None) -> bytes | None:
    """Signature bytes from either base64 alphabet (the server sends standard, the client
    URL-safe)."""
    if signature is None:
        return None
    text = signature.replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4))


def opening_text(request: dict[str, Any]) -> str:
    return " ".join(part.get("text", "") for part in request["contents"][0]["parts"])


@pytest.mark.parametrize("streaming", [False, True])
def test_a_trimmed_tool_loop_sends_every_kept_call_back_with_its_signature(
    fake: FakeGemini, streaming: bool
) -> None:
    [reply], audit = run_stage(fake, ["Do the search stage now."], streaming=streaming)

    entries = fake.requests()
    received = received_signatures(audit)
    assert json.loads(reply) == ROOT_CAUSE
    assert [(e["step"], e["status"]) for e in entries] == [(n, 200) for n in range(7)]
    assert sorted(received) == sorted(PATHS)
    trimmed = [e for e in entries if TRIMMED in opening_text(e["request"])]
    assert len(trimmed) >= 3
    for entry in trimmed:
        sent = sent_signatures(entry["request"])
        assert 0 < len(sent) < entry["step"]
        assert sent == {path: received[path] for path in sent}
        assert None not in sent.values()


@pytest.mark.parametrize("streaming", [False, True])
def test_a_second_turn_in_the_session_sends_the_first_turns_calls_back_unchanged(
    fake: FakeGemini, streaming: bool
) -> None:
    messages = ["Do the search stage now.", "Repeat your answer as JSON."]
    replies, audit = run_stage(fake, messages, streaming=streaming)

    entries = fake.requests()
    received = received_signatures(audit)
    last = entries[-1]["request"]
    assert [json.loads(reply) for reply in replies] == [ROOT_CAUSE, ROOT_CAUSE]
    assert [(e["step"], e["status"]) for e in entries] == [(n, 200) for n in range(8)]
    assert last["contents"][-1] == {
        "role": "user",
        "parts": [{"text": "Repeat your answer as JSON."}],
    }
    sent = sent_signatures(last)
    assert len(sent) == 2
    assert sent == {path: received[path] for path in sent}

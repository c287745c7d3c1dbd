"""A real ADK agent (LlmAgent + Runner + Gemini) plays a scripted tool loop on the fake server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.google_llm import Gemini
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from testkit.gemini import FakeGemini

MODEL = "gemini-2.5-flash"
SCENARIO = {
    "agents": {
        "search": [
            {"call": {"name": "read_file", "args": {"path": "a.py"}}},
            {"call": {"name": "read_file", "args": {"path": "b.py"}}},
            {"json": {"root_cause": "cents are divided twice"}},
        ]
    }
}


def run_search_agent(fake: FakeGemini, streaming_mode: StreamingMode) -> tuple[str, list[str]]:
    """Run the `search` agent once; return its final text and the paths its tool read."""
    paths: list[str] = []

    def read_file(path: str) -> dict[str, str]:
        """Read a file of the repository."""
        paths.append(path)
        return {"content": f"# {path}"}

    model = Gemini(model=MODEL, base_url=fake.url, client_kwargs={"api_key": "fake-key"})
    agent = LlmAgent(name="search", model=model, instruction="Find the bug.", tools=[read_file])
    runner = Runner(
        agent=agent,
        app_name="baton-test",
        session_service=InMemorySessionService(),
        auto_create_session=True,
    )
    message = types.Content(role="user", parts=[types.Part(text="Prices are off by 100x.")])

    async def run() -> str:
        final = ""
        events = runner.run_async(
            user_id="run-1",
            session_id="run-1:search:1",
            new_message=message,
            run_config=RunConfig(streaming_mode=streaming_mode),
        )
        async for event in events:
            if event.is_final_response() and event.content and not event.partial:
                final = "".join(part.text or "" for part in event.content.parts)
        await runner.close()
        return final

    return asyncio.run(run()), paths


def parts_of(contents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The `kind` parts (e.g. "functionCall") of a recorded request's contents, in order."""
    return [part[kind] for content in contents for part in content["parts"] if kind in part]


@pytest.mark.parametrize("streaming_mode", [StreamingMode.NONE, StreamingMode.SSE])
def test_an_adk_agent_plays_a_scripted_tool_loop_end_to_end(streaming_mode: StreamingMode) -> None:
    with FakeGemini.start(SCENARIO) as fake:
        final, paths = run_search_agent(fake, streaming_mode)
        entries = fake.requests()

    assert final == '{"root_cause":"cents are divided twice"}'
    assert paths == ["a.py", "b.py"]
    assert [(e["agent"], e["step"], e["status"]) for e in entries] == [
        ("search", 0, 200),
        ("search", 1, 200),
        ("search", 2, 200),
    ]
    assert {e["stream"] for e in entries} == {streaming_mode == StreamingMode.SSE}
    last_contents = entries[-1]["request"]["contents"]
    responses = [
        p["functionResponse"] for c in last_contents for p in c["parts"] if "functionResponse" in p
    ]
    assert [r["response"] for r in responses] == [{"content": "# a.py"}, {"content": "# b.py"}]


def test_adk_pairs_calls_with_responses_itself_so_scripts_need_no_call_ids() -> None:
    with FakeGemini.start(SCENARIO) as fake:
        _, paths = run_search_agent(fake, StreamingMode.NONE)
        entries = fake.requests()

    second_request = entries[1]["request"]["contents"]
    [call] = parts_of(second_request, "functionCall")
    [response] = parts_of(second_request, "functionResponse")
    assert paths == ["a.py", "b.py"]
    assert call == {"name": "read_file", "args": {"path": "a.py"}}
    assert (response["name"], response["response"]) == ("read_file", {"content": "# a.py"})
    assert "id" not in response

"""A real ADK agent (LlmAgent + Runner + Gemini) plays a scripted tool loop on the fake server,
which checks, like Gemini 3, that ADK sends every thought signature back."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.google_llm import Gemini
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from testkit.gemini import FakeGemini

MODEL = "gemini-3.8-flash"
SCENARIO = {
    "agents": {
        "search": [
            {"call": {"name": "read_file", "args": {"path": "a.py"}}},
            {"call": {"name": "read_file", "args": {"path": "b.py"}}},
            {"json": {"root_cause": "cents are divided twice"}},
        ],
        "fanout": [
            {"calls": [{"name": "read_file", "args": {"path": "a.py"}},
                       {"name": "read_file", "args": {"path": "b.py"}}]},
            {"text": "read both", "thought": "Both files are read; I can answer."},
        ],
    }
}  # fmt: skip
ROOT_CAUSE = '{"root_cause":"cents are divided twice"}'


class Run(NamedTuple):
    """What one agent run gave: its final text (thoughts left out), the paths its tool read
    and the thought texts among its events."""

    final: str
    paths: list[str]
    thoughts: list[str]


def run_agent(
    fake: FakeGemini,
    streaming_mode: StreamingMode = StreamingMode.NONE,
    *,
    name: str = "search",
    config: types.GenerateContentConfig | None = None,
) -> Run:
    """Run the agent `name` once."""
    paths: list[str] = []
    thoughts: list[str] = []

    def read_file(path: str) -> dict[str, str]:
        """Read a file of the repository."""
        paths.append(path)
        return {"content": f"# {path}"}

    model = Gemini(model=MODEL, base_url=fake.url, client_kwargs={"api_key": "fake-key"})
    agent = LlmAgent(
        name=name,
        model=model,
        instruction="Find the bug.",
        tools=[read_file],
        generate_content_config=config,
    )
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
            parts = event.content.parts or [] if event.content and not event.partial else []
            thoughts.extend(part.text or "" for part in parts if part.thought)
            if event.is_final_response() and parts:
                final = "".join(part.text or "" for part in parts if not part.thought)
        await runner.close()
        return final

    return Run(asyncio.run(run()), paths, thoughts)


def parts_of(contents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The `kind` parts (e.g. "functionCall") of a recorded request's contents, in order."""
    return [part[kind] for content in contents for part in content["parts"] if kind in part]


def signed_calls(contents: list[dict[str, Any]]) -> list[list[bool]]:
    """Per model content of a recorded request: whether each of its calls carries a signature."""
    return [
        ["thoughtSignature" in part for part in content["parts"] if "functionCall" in part]
        for content in contents
        if content["role"] == "model"
    ]


@pytest.mark.parametrize("streaming_mode", [StreamingMode.NONE, StreamingMode.SSE])
def test_an_adk_agent_plays_a_scripted_tool_loop_end_to_end(streaming_mode: StreamingMode) -> None:
    with FakeGemini.start(SCENARIO) as fake:
        final, paths, _ = run_agent(fake, streaming_mode)
        entries = fake.requests()

    assert final == ROOT_CAUSE
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
    assert signed_calls(last_contents) == [[True], [True]]


def test_adk_sends_a_parallel_replys_one_signature_back_on_its_first_call() -> None:
    with FakeGemini.start(SCENARIO) as fake:
        final, paths, _ = run_agent(fake, name="fanout")
        entries = fake.requests()

    assert (final, paths) == ("read both", ["a.py", "b.py"])
    assert [(e["step"], e["status"]) for e in entries] == [(0, 200), (1, 200)]
    assert signed_calls(entries[1]["request"]["contents"]) == [[True, False]]


@pytest.mark.parametrize("streaming_mode", [StreamingMode.NONE, StreamingMode.SSE])
def test_an_adk_agent_that_asks_for_thoughts_gets_them_apart_from_its_answer(
    streaming_mode: StreamingMode,
) -> None:
    config = types.GenerateContentConfig(
        thinking_config=types.ThinkingConfig(include_thoughts=True)
    )
    with FakeGemini.start(SCENARIO) as fake:
        final, _, thoughts = run_agent(fake, streaming_mode, name="fanout", config=config)
        entries = fake.requests()

    assert final == "read both"
    assert thoughts == ["I will call read_file, read_file.", "Both files are read; I can answer."]
    assert [e["status"] for e in entries] == [200, 200]


def test_adk_pairs_calls_with_responses_itself_so_scripts_need_no_call_ids() -> None:
    with FakeGemini.start(SCENARIO) as fake:
        _, paths, _ = run_agent(fake)
        entries = fake.requests()

    second_request = entries[1]["request"]["contents"]
    [call] = parts_of(second_request, "functionCall")
    [response] = parts_of(second_request, "functionResponse")
    assert paths == ["a.py", "b.py"]
    assert call == {"name": "read_file", "args": {"path": "a.py"}}
    assert (response["name"], response["response"]) == ("read_file", {"content": "# a.py"})
    assert "id" not in response

"""The second baseline of the overhead benchmark: the plain chain of `bench.chain_app`, except
that each task runs its model call as Baton's stages do, in a fresh Google ADK session: a new
`LlmAgent`, `Runner` and `InMemorySessionService`, one user message, one model call through
ADK's `Gemini` on google-genai's async client.

It keeps every advantage Baton's worker has: those of `bench.baseline` (one google-genai client
per process, the garbage collector settings), one event loop per process (the client's
connection stays open from task to task), ADK's telemetry told not to capture message contents,
and ADK's absent `a2a` import skipped. What it leaves
out is what Baton adds to a stage: the run store, the lease and its heartbeat, the fleet's
quota, budgets, audit entries and the checks on the output. Baton's CPU per stage minus this
chain's is what those cost.
"""

from __future__ import annotations

import asyncio
import functools

from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.models.google_llm import Gemini
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.telemetry.context import ContentCapturingMode, TelemetryConfig
from google.genai import types

from bench.baseline import client, worker_app
from orchestrator.core.settings import DEFAULT_MODEL
from workers import agent as _baton_agent  # noqa: F401  (importing it skips ADK's absent a2a)

MODEL = DEFAULT_MODEL
APP_NAME = "bench-adk-chain"
JSON_REPLY = types.GenerateContentConfig(response_mime_type="application/json")
TELEMETRY = TelemetryConfig(capture_message_content=ContentCapturingMode.NO_CONTENT)

app = worker_app("bench-adk-chain")


@functools.cache
def loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop: the shared client's connections belong to it."""
    return asyncio.new_event_loop()


async def fresh_session(name: str, instruction: str) -> str:
    """One turn of a new agent in a new session; the reply's text."""
    agent = LlmAgent(
        name=name,
        model=Gemini(model=MODEL, client=client()),
        instruction=lambda _context: instruction,  # as Baton's: no templating by ADK
        generate_content_config=JSON_REPLY,
    )
    runner = Runner(agent=agent, app_name=APP_NAME, session_service=InMemorySessionService())
    try:
        session = await runner.session_service.create_session(app_name=APP_NAME, user_id=name)
        message = types.Content(role="user", parts=[types.Part(text=f"Do the {name} stage now.")])
        text = ""
        async for event in runner.run_async(
            user_id=name,
            session_id=session.id,
            new_message=message,
            run_config=RunConfig(telemetry=TELEMETRY),
        ):
            if event.content and event.content.parts and event.content.parts[0].text:
                text = event.content.parts[0].text
        return text
    finally:
        await runner.close()


@app.task(name="bench.adk_stage")
def stage(previous: str | None, name: str) -> str:
    """One fresh ADK session with one model call; its reply goes to the next task."""
    instruction = f"Stage {name}." + (f" Before you: {previous}" if previous else "")
    return loop().run_until_complete(fresh_session(name, instruction))

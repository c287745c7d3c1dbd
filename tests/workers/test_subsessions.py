"""The session service that stamps a child's label on the events its runner appends
(`workers.subsessions`)."""

from __future__ import annotations

import asyncio
from typing import Any

from google.adk.events import Event
from google.adk.sessions import InMemorySessionService
from google.genai import types

from orchestrator.core.rules import StageBudget
from testkit.inprocess import InProcessGemini
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.subsessions import LabellingSessionService


def test_the_wrapping_service_stamps_every_appended_event_and_stores_through_its_inner() -> None:
    inner = InMemorySessionService()
    service = LabellingSessionService(inner, "fixer-plus.search.sub")

    async def run() -> list[str | None]:
        session = await service.create_session(app_name="a", user_id="u", session_id="s")
        text = types.Content(role="model", parts=[types.Part(text="hi")])
        for branch in (None, "fixer-plus.search.sub.sub_deep"):
            await service.append_event(
                session, Event(author="sub", invocation_id="i", content=text, branch=branch)
            )
        stored = await inner.get_session(app_name="a", user_id="u", session_id="s")
        assert stored is not None
        return [event.branch for event in stored.events]

    assert asyncio.run(run()) == ["fixer-plus.search.sub", "fixer-plus.search.sub.sub_deep"]


def test_a_session_s_audit_entries_carry_the_label_its_service_stamped() -> None:
    """The session is given no branch label of its own: every entry of an event has the one
    the wrapping service stamped on it, for ADK's events as they were stored."""
    fake = InProcessGemini({"agents": {"sub_x": [
        {"call": {"name": "echo", "args": {"text": "hi"}}}, {"text": "done"},
    ]}})  # fmt: skip
    audit: list[dict[str, Any]] = []

    def echo(text: str) -> dict[str, str]:
        """Echo the text.

        Args:
            text: What to echo.
        """
        return {"text": text}

    async def run() -> str:
        usage = Usage()
        spec = AgentSpec(name="sub_x", instruction="Echo.", contract="", budget=StageBudget(),
                         tools=[echo])  # fmt: skip
        service = LabellingSessionService(InMemorySessionService(), "p.s.sub_x")
        async with StageSession.open(
            build_agent(spec, fake.model(), usage), session_id="r:s:1:sub:sub_x:1", state={},
            audit=audit.extend, labels={"session": "r:s:1:sub:sub_x:1"}, usage=usage,
            session_service=service,
        ) as session:  # fmt: skip
            return await session.turn("Go.", max_model_calls=3)

    assert asyncio.run(run()) == "done"
    events = [entry for entry in audit if entry["kind"] != "user_message"]
    assert [entry["kind"] for entry in events] == ["tool_call", "tool_result", "model_reply"]
    assert {entry["branch"] for entry in events} == {"p.s.sub_x"}

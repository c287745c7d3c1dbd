"""The session service that stamps a child's label on the events its runner appends
(`workers.subsessions`)."""

from __future__ import annotations

import asyncio

from google.adk.events import Event
from google.adk.sessions import InMemorySessionService
from google.genai import types

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

"""The session service of a child agent's runner, which stamps the child's branch label on every
event it stores, without the child knowing (ids, labels and depth: `orchestrator.core.subsessions`),
and the form a kept child's session is stored in between two calls (`orchestrator.core.children`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.adk.events import Event
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse

from orchestrator.core.subsessions import stamped

BRANCH = "branch"
"""The audit entry's field that holds its branch label."""
SESSION = "session"
"""The audit entry's field that holds its session id."""


class LabellingSessionService(BaseSessionService):
    """A session service that stores through `inner` and stamps `label` on every event
    appended (`stamped`), so the child's events carry its place without the child knowing."""

    def __init__(
        self, inner: BaseSessionService, label: str, history: Sequence[Event] = ()
    ) -> None:
        self._inner = inner
        self.label = label
        self._history = list(history)

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session holding the `history` this service was given (a kept child's earlier
        turns, stored with the labels they had)."""
        session = await self._inner.create_session(
            app_name=app_name, user_id=user_id, state=state, session_id=session_id
        )
        for event in self._history:
            await self._inner.append_event(session, event)
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        return await self._inner.get_session(
            app_name=app_name, user_id=user_id, session_id=session_id, config=config
        )

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        return await self._inner.list_sessions(app_name=app_name, user_id=user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._inner.delete_session(app_name=app_name, user_id=user_id, session_id=session_id)

    async def append_event(self, session: Session, event: Event) -> Event:
        event.branch = stamped(self.label, event.branch)
        return await self._inner.append_event(session, event)


def dump_events(events: Sequence[Event], max_chars: int) -> list[str]:
    """A kept child's events as stored: each as JSON, its oldest turns (each from a user
    message to the next) dropped while they hold more than `max_chars` together. The latest
    turn is always kept, and the history always starts with a user message."""
    turns: list[list[str]] = []
    for event in events:
        if event.author == "user" or not turns:
            turns.append([])
        turns[-1].append(event.model_dump_json(exclude_none=True))
    while len(turns) > 1 and sum(len(e) for turn in turns for e in turn) > max_chars:
        turns.pop(0)
    return [event for turn in turns for event in turn]


def load_events(stored: Sequence[str]) -> list[Event]:
    """The events `dump_events` stored."""
    return [Event.model_validate_json(event) for event in stored]

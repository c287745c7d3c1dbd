"""The session service of a child agent's runner, which stamps the child's branch label on every
event it stores, without the child knowing (ids, labels and depth: `orchestrator.core.subsessions`).
"""

from __future__ import annotations

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

    def __init__(self, inner: BaseSessionService, label: str) -> None:
        self._inner = inner
        self.label = label

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        return await self._inner.create_session(
            app_name=app_name, user_id=user_id, state=state, session_id=session_id
        )

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

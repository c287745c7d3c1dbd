"""In-memory sinks for what a stage produces (artifacts, audit entries, kept children), for tests
and the benchmarks that run a stage without a run store."""

from __future__ import annotations

import hashlib

from orchestrator.core.children import KeptSession
from orchestrator.core.models import ArtifactRef


class MemoryArtifacts:
    """An artifact sink in memory (`workers.tools.artifacts.ArtifactSink`)."""

    def __init__(self, run_id: str = "local") -> None:
        self.run_id = run_id
        self.data: dict[str, bytes] = {}
        self.refs: dict[str, ArtifactRef] = {}

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str:
        """Keep `data` under `name` (replacing an artifact of that name)."""
        ref = ArtifactRef(
            run_id=self.run_id,
            name=name,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            media_type=media_type,
        )
        self.data[name] = bytes(data)
        self.refs[name] = ref
        return ref.uri


class MemoryChildren:
    """Kept children in memory (`orchestrator.core.children.Children`): they live as long as
    this object. Claims never lapse; one holder at a time, as in Redis."""

    def __init__(self) -> None:
        self.sessions: dict[str, KeptSession] = {}
        self._holders: dict[str, str] = {}

    def claim(self, name: str, holder: str, ttl_s: int) -> bool:
        return self._holders.setdefault(name, holder) == holder

    def release(self, name: str, holder: str) -> None:
        if self._holders.get(name) == holder:
            del self._holders[name]

    def load(self, name: str) -> KeptSession:
        kept = self.sessions.get(name)
        return KeptSession(list(kept.events), kept.delegations) if kept else KeptSession()

    def save(self, name: str, session: KeptSession) -> None:
        self.sessions[name] = KeptSession(list(session.events), session.delegations)

"""In-memory sinks for what a stage produces (artifacts, audit entries), for tests and the
benchmarks that run a stage without a run store."""

from __future__ import annotations

import hashlib

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

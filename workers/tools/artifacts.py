"""Where tools put what is too big for a prompt (a test log, a diff): artifact sinks."""

from __future__ import annotations

import hashlib
from typing import Protocol

from orchestrator.models import ArtifactRef


class ArtifactSink(Protocol):
    """Keeps artifacts of one stage execution; `save` returns the artifact's uri."""

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str: ...


class MemoryArtifacts:
    """An artifact sink in memory, for tests and for callers without a run store."""

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

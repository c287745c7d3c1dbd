"""Where tools put what is too big for a prompt (a test log, a diff): artifact sinks."""

from __future__ import annotations

from typing import Protocol


class ArtifactSink(Protocol):
    """Keeps artifacts of one stage execution; `save` returns the artifact's uri."""

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str: ...

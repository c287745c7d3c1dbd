"""Output schemas any pipeline may use, for stages that need no schema of their own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Summary(BaseModel):
    """A generic output for simple stages: a short free-text summary."""

    model_config = ConfigDict(extra="forbid")

    summary: str

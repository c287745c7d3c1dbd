"""The secrets a stage's declared tools use: read from the worker's environment by name, and
taken out of everything that leaves a tool.

A declaration names variables (`secrets = { token = "OWNERS_TOKEN" }`), never values. The
worker reads them when the stage's tools are built; the values go to the function or the MCP
server that declared them, and nowhere else: every tool's result, every error a tool returns
and every prompt a host tool sends to a model passes `Secrets.redact` first, so a value a tool
echoes becomes `[secret OWNERS_TOKEN]` before it reaches the model, the audit log or a log line.
Only the values as they are can be found: an encoded copy (base64, say) is the tool's to avoid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from workers.errors import StageError

MIN_SECRET_CHARS = 8
"""A shorter value could not be removed from output without mangling it: refused."""


class Secrets:
    """Secret values by the name of the variable they came from."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    @classmethod
    def read(
        cls, names: Iterable[str], environ: Mapping[str, str], *, tool: str, stage: str
    ) -> Secrets:
        """The variables `names` of `environ`, for the tool `tool` of `stage`.

        Raises:
            StageError: one is not set, or too short to be removed from output; the message
                names the variable, never its value.
        """
        values: dict[str, str] = {}
        for name in names:
            value = environ.get(name)
            if not value:
                raise StageError(
                    f"tool {tool!r} of stage {stage!r} needs the secret {name}, which is not set "
                    "in the worker's environment"
                )
            if len(value) < MIN_SECRET_CHARS:
                raise StageError(
                    f"the secret {name} of tool {tool!r} is shorter than {MIN_SECRET_CHARS} "
                    "characters, too short to be kept out of what the tool returns"
                )
            values[name] = value
        return cls(values)

    def value(self, name: str) -> str:
        return self._values[name]

    def __or__(self, other: Secrets) -> Secrets:
        return Secrets({**self._values, **other._values})

    def __bool__(self) -> bool:
        return bool(self._values)

    def redact(self, value: Any) -> Any:
        """`value` (a string, or JSON-ready data) with every secret replaced by its name."""
        if not self._values:
            return value
        if isinstance(value, str):
            for name, secret in sorted(self._values.items(), key=lambda item: -len(item[1])):
                value = value.replace(secret, f"[secret {name}]")
            return value
        if isinstance(value, dict):
            return {self.redact(key): self.redact(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact(item) for item in value]
        return value

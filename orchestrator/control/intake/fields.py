"""Typed reads from untrusted JSON.

Every read either returns a clean value or raises an `IntakeError` naming the dotted path of
the field that was wrong (`exception.values[0].stacktrace.frames[3].lineno`). Strings come back
with control characters other than newline and tab removed; nothing is ever interpreted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.control.plain import CONTROL
from orchestrator.core.errors import IntakeError

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_URL = re.compile(r"https?://[^\s/]+\S*", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,39}")
MAX_KEY_CHARS = 40
"""A longer key from the payload is shortened where an error message names it."""


def clean(text: str) -> str:
    """`text` without control characters (newline and tab stay). Surrogates, which JSON can
    smuggle in as `\\ud800` and a `str` payload can hold as they are, become the character a
    pair of them encodes, or U+FFFD when alone: either way the result encodes as UTF-8."""
    text = CONTROL.sub("", text)
    if _SURROGATE.search(text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def at(path: str, key: str | int) -> str:
    """The dotted path of `key` below `path`: `at("exception", "values")`, `at("values", 0)`.

    A key from the payload that is not a plain name (a tag's, say) is shown cleaned, quoted
    and shortened, `tags['build id']`, so that an error message stays one printable line."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _NAME.fullmatch(key):
        shown = clean(key[:MAX_KEY_CHARS]) + ("…" if len(key) > MAX_KEY_CHARS else "")
        return f"{path}[{shown!r}]"
    return f"{path}.{key}" if path else key


def kind(value: Any) -> str:
    """What a JSON value is, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


@dataclass(frozen=True)
class Node:
    """A JSON object and the dotted path it was found at (`""` for the payload itself).

    Each reader takes one or more keys, aliases of one field (`"lineno", "lineNo"`), and reads
    the first that is present and not null; a field that is absent or null reads as `None`.
    """

    data: Mapping[str, Any]
    path: str = ""

    @classmethod
    def of(cls, value: Any, path: str) -> Node:
        if not isinstance(value, dict):
            raise IntakeError(f"expected an object, got {kind(value)}", path or None)
        return cls(value, path)

    def find(self, *keys: str) -> tuple[str, Any] | None:
        """The path and value of the first of `keys` that is present and not null."""
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                return at(self.path, key), value
        return None

    def _get(self, *keys: str) -> tuple[str, Any]:
        """Like `find`, with the first key's path and `None` when no key has a value."""
        return self.find(*keys) or (at(self.path, keys[0]), None)

    def text(self, *keys: str) -> str | None:
        path, value = self._get(*keys)
        return as_text(value, path)

    def link(self, *keys: str) -> str | None:
        """An http(s) URL; anything else (`javascript:`, a path, text) reads as `None`."""
        url = self.text(*keys)
        return url if url and _URL.fullmatch(url) else None

    def ident(self, *keys: str) -> str | None:
        """An id, which sources send as a string or as a number."""
        value = self._get(*keys)[1]
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self.text(*keys)

    def integer(self, *keys: str) -> int | None:
        path, value = self._get(*keys)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise IntakeError(f"expected a whole number, got {kind(value)}", path)

    def flag(self, *keys: str) -> bool | None:
        path, value = self._get(*keys)
        if value is None or isinstance(value, bool):
            return value
        raise IntakeError(f"expected true or false, got {kind(value)}", path)

    def node(self, *keys: str) -> Node | None:
        found = self.find(*keys)
        return None if found is None else Node.of(found[1], found[0])

    def items(self, *keys: str) -> list[tuple[str, Any]]:
        """The path and value of each element of a list; `[]` when the field is absent."""
        found = self.find(*keys)
        if found is None:
            return []
        path, value = found
        if not isinstance(value, list):
            raise IntakeError(f"expected a list, got {kind(value)}", path)
        return [(at(path, index), element) for index, element in enumerate(value)]

    def nodes(self, *keys: str) -> list[Node]:
        """The elements of a list of objects."""
        return [Node.of(value, path) for path, value in self.items(*keys)]


def as_text(value: Any, path: str) -> str | None:
    """`value`, found at `path`, as a clean string; `None` stays `None`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise IntakeError(f"expected a string, got {kind(value)}", path)
    return clean(value)


def nonblank(text: str | None) -> str | None:
    """`text` without surrounding whitespace, or `None` when nothing is left."""
    stripped = text.strip() if text else ""
    return stripped or None


def trim_lines(text: str | None) -> str | None:
    """`text` without leading and trailing blank lines (indentation of the first line stays),
    or `None` when nothing is left."""
    lines = (text or "").splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines) or None

"""Values shown whole to a person (`baton log --full`): a mapping's fields one per line, a list's
items one per line, a string with line breaks as its own lines, nested values indented under
their key, nothing cut.

A value comes from a model or a tool, so it may hold a hostile repository's bytes: every
control character but the line break and the tab is shown escaped (`\\x1b`), so that no value
can move the cursor, recolour or retitle the terminal it is printed on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

INDENT = "  "
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 (but tab and line feed), DEL and C1: a carriage return too, which would overwrite a line.
Intake removes them from a report; the views escape them."""


def safe(text: str) -> str:
    """`text` with its control characters escaped (tab and line feed kept)."""
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def lines(value: Any, depth: int = 0) -> list[str]:
    """`value` as indented lines, `depth` levels in."""
    pad = INDENT * depth
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        return [
            line
            for key, item in value.items()
            for line in _field(f"{pad}{safe(str(key))}:", item, depth)
        ]
    if isinstance(value, list | tuple):
        if not value:
            return [pad + "[]"]
        return [line for item in value for line in _field(f"{pad}-", item, depth)]
    return [pad + line for line in scalar(value).split("\n")]


def scalar(value: Any) -> str:
    """A string as itself (escaped; `""` when empty), anything else as JSON writes it."""
    if isinstance(value, str):
        return safe(value) if value else '""'
    return safe(json.dumps(value, default=str))


def _field(head: str, item: Any, depth: int) -> list[str]:
    """`head` and the item beside it when it is one line, else the item's lines under it."""
    nested = isinstance(item, Mapping | list | tuple) and bool(item)
    if not nested and "\n" not in scalar(item):
        return [f"{head} {scalar(item)}"]
    return [head, *lines(item, depth + 1)]

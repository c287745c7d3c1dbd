"""Deterministic token counts, so tests and budgets can predict them exactly.

    prompt_tokens     = ceil(len(compact_json([systemInstruction, contents, tools])) / 4)
    candidates_tokens = ceil(len(compact_json(reply_parts)) / 4)

A missing `systemInstruction` counts as `null`, missing `contents` or `tools` as `[]`.
`compact_json` is `json.dumps` with `separators=(",", ":")` and `ensure_ascii=False`, keys in
the order they arrived; lengths are in characters. Four characters per token is roughly what
Gemini's tokenizer gives for English and code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4


def compact_json(value: Any) -> str:
    """`value` as JSON without whitespace between tokens and with non-ASCII kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def count(value: Any) -> int:
    """Tokens of `value`: its compact JSON length divided by four, rounded up."""
    return math.ceil(len(compact_json(value)) / CHARS_PER_TOKEN)


def prompt_tokens(request: Mapping[str, Any]) -> int:
    """Tokens of what a request asks the model to read."""
    prompt = [
        request.get("systemInstruction"),
        request.get("contents", []),
        request.get("tools", []),
    ]
    return count(prompt)

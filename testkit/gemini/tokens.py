"""Deterministic token counts, so tests and budgets can predict them exactly.

    prompt_tokens     = ceil(len(compact_json([systemInstruction, contents, tools])) / 4)
    candidates_tokens = ceil(len(compact_json(answer_parts)) / 4)
    thoughts_tokens   = ceil(len(thought_text) / 4)
    cached_tokens     = prompt_tokens of the request cut to its cached leading contents, else 0
    total_tokens      = prompt_tokens + candidates_tokens + thoughts_tokens

A missing `systemInstruction` counts as `null`, missing `contents` or `tools` as `[]`.
`answer_parts` are the reply's parts as the scenario scripts them: without the thought part and
without `thoughtSignature`. `thought_text` is the step's thought summary (see `scenario`); it
is counted whether or not the request asked to see it, as the real model thinks either way.

Implicit caching: a request's cached leading contents are the longest run of its first contents
that an earlier request of the same model and agent, with the same `systemInstruction` and
`tools`, also began with and that was answered with 200 (see `cache`); `cached_tokens` is
`prompt_tokens` of the request with only those contents, 0 when there are none. Cached tokens
are part of the prompt, so the total does not add them again; thoughts are not part of the
candidates, so it does (as the real `usageMetadata` sums them).

`compact_json` is `json.dumps` with `separators=(",", ":")` and `ensure_ascii=False`, keys in
the order they arrived; lengths are in characters. Four characters per token is roughly what
Gemini's tokenizer gives for English and code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

CHARS_PER_TOKEN = 4


class Usage(NamedTuple):
    """The token counts of one reply, as `usageMetadata` reports them."""

    prompt: int
    candidates: int = 0
    thoughts: int = 0
    cached: int = 0

    @property
    def total(self) -> int:
        """Prompt, candidates and thoughts (the cached tokens are part of the prompt)."""
        return self.prompt + self.candidates + self.thoughts


def compact_json(value: Any) -> str:
    """`value` as JSON without whitespace between tokens and with non-ASCII kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def count(value: Any) -> int:
    """Tokens of `value`: its compact JSON length divided by four, rounded up."""
    return math.ceil(len(compact_json(value)) / CHARS_PER_TOKEN)


def text_tokens(text: str) -> int:
    """Tokens of a plain text: its length divided by four, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_tokens(request: Mapping[str, Any], contents: int | None = None) -> int:
    """Tokens of what a request asks the model to read; with `contents`, of the request cut to
    its first `contents` contents."""
    kept = request.get("contents", [])
    prompt = [
        request.get("systemInstruction"),
        kept if contents is None else kept[:contents],
        request.get("tools", []),
    ]
    return count(prompt)

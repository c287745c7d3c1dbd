"""Context budgets inside a stage: tool outputs cut to size, requests trimmed to a token budget.

Sizes are estimated as characters / 4, the same rule the fake Gemini server counts tokens by.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
TRIM_NOTE = (
    "[Baton: left out {turns} earlier model turns and their tool results to fit this stage's "
    "request budget; call the tools again if you need what they returned.]"
)
"""Added to the user message of a trimmed request, so that the model knows to call again."""
MIN_STRING_CHARS = 80
"""`shrink_to_fit` never cuts a string below this many characters."""
_MARKER_ROOM = 40


def json_chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


def shrink_to_fit(value: Any, max_chars: int) -> tuple[Any, int]:
    """Cut the longest strings, then the longest lists, until `value` fits `max_chars` as JSON.

    Every cut leaves a marker saying how much was cut. Returns the new value and the number of
    characters removed (0 when it already fit). The value keeps its shape: dicts keep their keys.
    """
    value = json.loads(json.dumps(value, default=str))
    before = json_chars(value)
    for _ in range(10_000):
        excess = json_chars(value) - max_chars
        if excess <= 0:
            break
        if not (_cut_longest_string(value, excess) or _cut_longest_list(value)):
            break
    return value, max(0, before - json_chars(value))


def _leaves(value: Any) -> list[tuple[Any, Any, Any]]:
    """(container, key, child) for every child of every dict and list in `value`."""
    found, stack = [], [value]
    while stack:
        node = stack.pop()
        items = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for key, child in items:
            found.append((node, key, child))
            stack.append(child)
    return found


def _cut_longest_string(value: Any, excess: int) -> bool:
    strings = [
        (c, k, s)
        for c, k, s in _leaves(value)
        if isinstance(s, str) and len(s) > MIN_STRING_CHARS + _MARKER_ROOM
    ]
    if not strings:
        return False
    container, key, text = max(strings, key=lambda leaf: len(leaf[2]))
    keep = max(MIN_STRING_CHARS, len(text) - excess - _MARKER_ROOM)
    container[key] = text[:keep] + f"…[cut {len(text) - keep} of {len(text)} chars]"
    return True


def _cut_longest_list(value: Any) -> bool:
    lists = [child for _, _, child in _leaves(value) if isinstance(child, list) and len(child) > 1]
    if not lists:
        return False
    longest = max(lists, key=json_chars)
    dropped = max(1, len(longest) // 4)
    del longest[len(longest) - dropped :]
    if all(isinstance(item, str) for item in longest):
        longest.append(f"…[{dropped} more items cut]")
    return True


def tool_output_limiter(max_chars: int) -> Callable[..., dict[str, Any] | None]:
    """An `after_tool_callback` that cuts a tool's result to `max_chars` with a marker."""

    def after_tool(
        tool: Any, args: dict[str, Any], tool_context: Any, tool_response: Any
    ) -> dict[str, Any] | None:
        response = tool_response if isinstance(tool_response, dict) else {"result": tool_response}
        size = json_chars(response)
        if size <= max_chars:
            return None
        cut, removed = shrink_to_fit(response, max_chars)
        if json_chars(cut) > max_chars:
            text = json.dumps(response, ensure_ascii=False, default=str)
            cut = {"result": text[: max_chars - 120]}
            removed = size - len(cut["result"])
        cut["truncated"] = f"tool output cut to fit the budget: {removed} of {size} chars removed"
        logger.info(
            "tool %s output cut from %d to %d chars",
            getattr(tool, "name", "?"),
            size,
            json_chars(cut),
        )
        return cut

    return after_tool


def request_tokens(request: LlmRequest) -> int:
    """Estimated prompt tokens of a request: system instruction, tools and contents."""
    config = request.config
    chars = sum(_content_chars(c) for c in request.contents)
    if config and config.system_instruction:
        chars += _system_chars(config.system_instruction)
    if config and config.tools:
        chars += sum(
            len(t.model_dump_json(exclude_none=True))
            for t in config.tools
            if hasattr(t, "model_dump_json")
        )
    return -(-chars // CHARS_PER_TOKEN)


def _content_chars(content: types.Content) -> int:
    return len(content.model_dump_json(exclude_none=True))


def _system_chars(instruction: Any) -> int:
    """The system instruction as the request carries it: a content holding its text, as JSON
    (so every newline and quote of the text counts twice, as it does on the wire)."""
    if isinstance(instruction, types.Content):
        return _content_chars(instruction)
    return json_chars({"parts": [{"text": str(instruction)}]})


def request_trimmer(max_tokens: int) -> Callable[..., LlmResponse | None]:
    """A `before_model_callback` that drops the oldest exchanges until the request fits.

    The first content (the stage's one user message) always stays, and so do the newest
    exchange and the newest later user message (a repair turn's, which starts the turn the
    model is in). A function call and its response are dropped together, never one without the
    other, so every call kept keeps its thought signature beside it. Only the outgoing request
    changes; the session keeps its history.
    """

    def before_model(callback_context: Any, llm_request: LlmRequest) -> LlmResponse | None:
        if request_tokens(llm_request) <= max_tokens or len(llm_request.contents) < 3:
            return None
        head, units = llm_request.contents[0], exchanges(llm_request.contents[1:])
        kept = newest_user_message(units)
        turns = 0
        while request_tokens(llm_request) > max_tokens:
            droppable = [u for u in units[:-1] if u is not kept]
            if not droppable:
                break
            units.remove(droppable[0])
            turns += sum(1 for content in droppable[0] if content.role == "model")
            llm_request.contents = [head] + [c for u in units for c in u]
        if turns:
            note = types.Part(text=TRIM_NOTE.format(turns=turns))
            head = head.model_copy(update={"parts": [*(head.parts or []), note]})
            llm_request.contents = [head, *llm_request.contents[1:]]
            logger.info(
                "request trimmed: %d model turns left out, ~%d tokens",
                turns,
                request_tokens(llm_request),
            )
        return None

    return before_model


def newest_user_message(units: list[list[types.Content]]) -> list[types.Content] | None:
    """The newest unit that is a user's text message (not a function's response), if any."""
    for unit in reversed(units):
        parts = [p for c in unit if c.role == "user" for p in c.parts or []]
        if parts and any(p.text for p in parts) and not any(p.function_response for p in parts):
            return unit
    return None


def exchanges(contents: list[types.Content]) -> list[list[types.Content]]:
    """Group contents so that a function call and the responses to it stay together."""
    units: list[list[types.Content]] = []
    for content in contents:
        parts = content.parts or []
        is_response = any(p.function_response for p in parts)
        if (
            is_response
            and units
            and any(p.function_call for c in units[-1] for p in (c.parts or []))
        ):
            units[-1].append(content)
        else:
            units.append([content])
    return units

"""The OpenAI chat-completions wire format the fake speaks: replies, SSE chunks, errors, usage.

A reply (`POST /v1/chat/completions`)::

    {"id": "chatcmpl-…", "object": "chat.completion", "created": 1767000000, "model": "…",
     "choices": [{"index": 0, "finish_reason": "stop" | "tool_calls",
                  "message": {"role": "assistant", "content": "…" | null,
                              "tool_calls": [{"id": "call_…", "type": "function",
                                              "function": {"name": "…", "arguments": "{…}"}}]}}],
     "usage": {"prompt_tokens": P, "completion_tokens": C, "total_tokens": P + C,
               "prompt_tokens_details": {"cached_tokens": 0},
               "completion_tokens_details": {"reasoning_tokens": R}}}

`arguments` is a JSON *string*, as OpenAI sends it; `tool_calls` is left out of a text reply.
Token counts: `P` is the compact JSON of `[messages, tools]` over four, rounded up; `R` the
step's thought summary over four; `C` the answer's compact JSON (its content, or its calls)
over four plus `R`: like OpenAI's, the completion tokens include the reasoning ones.

Streamed (`"stream": true`): `data: <chunk>` events of `"object": "chat.completion.chunk"`, a
first with the whole `delta` (`role`, `content` or `tool_calls` with their `index`), a second
with an empty delta and the `finish_reason`, then, when the request sets
`stream_options.include_usage`, one with no choices and the `usage`; then `data: [DONE]`.

An error: `{"error": {"message", "type", "param": null, "code"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from testkit.gemini.scenario import Step
from testkit.gemini.tokens import compact_json, count, text_tokens

ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
"""HTTP status → (`type`, `code`, `message`) as OpenAI words them; the statuses a fault may
answer with."""


class Usage(NamedTuple):
    """The token counts of one reply."""

    prompt: int
    completion: int = 0
    """Answer and reasoning together, as OpenAI counts them."""
    reasoning: int = 0

    def wire(self) -> dict[str, Any]:
        """`usage` as OpenAI sends it."""
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        }


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of what a request asks the model to read: its messages and tools."""
    return count([body.get("messages", []), body.get("tools", [])])


def message(step: Step, call_prefix: str) -> dict[str, Any]:
    """The assistant message a step scripts; its calls' ids start with `call_prefix`."""
    parts = step.parts()
    calls = [part["functionCall"] for part in parts if "functionCall" in part]
    if not calls:
        return {"role": "assistant", "content": "".join(part.get("text", "") for part in parts)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"{call_prefix}_{index}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
            }
            for index, call in enumerate(calls)
        ],
    }


def usage(step: Step, reply: Mapping[str, Any], prompt: int) -> Usage:
    """The counts of `reply` (a `message`) to a prompt of `prompt` tokens."""
    answer = reply["tool_calls"] if reply.get("tool_calls") else reply.get("content") or ""
    reasoning = text_tokens(step.thought_summary())
    return Usage(prompt, count(answer) + reasoning, reasoning)


def completion(
    reply: Mapping[str, Any], model: str, counted: Usage, *, reply_id: str, created: int
) -> dict[str, Any]:
    """A non-streamed reply."""
    return {
        "id": reply_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": dict(reply), "finish_reason": _finish(reply)}],
        "usage": counted.wire(),
    }


def chunks(
    reply: Mapping[str, Any],
    model: str,
    counted: Usage,
    *,
    reply_id: str,
    created: int,
    include_usage: bool,
) -> list[bytes]:
    """A streamed reply as SSE events, `[DONE]` last."""
    delta: dict[str, Any] = {"role": "assistant"}
    if reply.get("tool_calls"):
        delta["tool_calls"] = [
            {"index": index, **call} for index, call in enumerate(reply["tool_calls"])
        ]
    else:
        delta["content"] = reply.get("content") or ""
    head = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": model}
    events = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(reply)}]},
    ]
    if include_usage:
        events.append({**head, "choices": [], "usage": counted.wire()})
    return [f"data: {compact_json(event)}\n\n".encode() for event in events] + [b"data: [DONE]\n\n"]


def error(status: int, message: str | None = None) -> bytes:
    """An error body for `status`."""
    kind, code, said = ERRORS[status]
    body = {"error": {"message": message or said, "type": kind, "param": None, "code": code}}
    return json.dumps(body).encode()


def _finish(reply: Mapping[str, Any]) -> str:
    return "tool_calls" if reply.get("tool_calls") else "stop"

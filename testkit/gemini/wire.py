"""The Gemini REST wire format the fake speaks: response bodies, SSE chunks and error bodies.

Shapes follow what google-genai 2.34 parses (shared/notes/adk-genai.md §4, §5): camelCase keys,
`usageMetadata` on every reply, and errors as `{"error": {"code", "message", "status",
"details"}}` with `google.rpc.RetryInfo` in `details` for a 429.

A reply's parts are what the step scripts, after a thought part (`{"text": ..., "thought":
true}`) when the request asks for thoughts (`generationConfig.thinkingConfig.includeThoughts`),
with a `thoughtSignature` where `signatures` puts one. `usageMetadata` holds
`promptTokenCount`, `candidatesTokenCount`, `thoughtsTokenCount` and `totalTokenCount` (their
sum), and `cachedContentTokenCount` when part of the prompt was cached (a part of the prompt,
not added to the total); zero counts other than the candidates are left out, as the real API
leaves out zero fields.

A streamed reply: a text reply comes in at least two chunks of its text, after a chunk with the
thought part when there is one; its signature rides on the last chunk. Every chunk carries
`usageMetadata` counting the reply so far (the thoughts are complete from the first chunk), and
only the last has `finishReason`. Any other reply comes in one chunk.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from testkit.gemini.tokens import Usage, compact_json, count

ERRORS: dict[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: (
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
    ),
    403: ("PERMISSION_DENIED", "The caller does not have permission."),
    404: ("NOT_FOUND", "Requested entity was not found."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: ("INTERNAL", "An internal error has occurred. Please retry or report the problem."),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
}
"""HTTP status → (gRPC status name, message) as the real API words them; the statuses a fault
rule may inject."""

RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"
MISSING_SIGNATURE = (
    "Function call is missing a thought_signature in functionCall parts. This is required for "
    "tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `default_api:{name}` , position {position}. "
    "Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)
"""The 400 message for a current-turn function call without its signature, as Gemini 3 words
it; `position` is the 1-based index of the model content in `contents`."""
CORRUPTED_SIGNATURE = "Corrupted thought signature."
"""The 400 message for a signature that was altered or not issued by this server."""
STREAM_CHUNK_CHARS = 200
"""Largest piece of text in one streamed chunk."""
SIGNATURE_FIELD = "thoughtSignature"
"""The part field that holds a thought signature (base64)."""
_THOUGHT = "thought"


def field(message: Any, name: str) -> Any:
    """A field of a request's JSON object by its lowerCamelCase name, else by its proto name
    (`include_thoughts` for `includeThoughts`): the API's JSON parser takes both, and
    google-genai 2.34 sends `thinkingConfig` with proto names. None when absent."""
    if not isinstance(message, dict):
        return None
    if name in message:
        return message[name]
    return message.get(re.sub(r"(?<!^)([A-Z])", lambda m: "_" + m.group(1).lower(), name))


def usage(counts: Usage) -> dict[str, int]:
    """The `usageMetadata` object of a reply."""
    metadata = {
        "promptTokenCount": counts.prompt,
        "candidatesTokenCount": counts.candidates,
        "totalTokenCount": counts.total,
    }
    if counts.thoughts:
        metadata["thoughtsTokenCount"] = counts.thoughts
    if counts.cached:
        metadata["cachedContentTokenCount"] = counts.cached
    return metadata


def reply(
    parts: list[dict[str, Any]], model: str, counts: Usage, *, final: bool = True
) -> dict[str, Any]:
    """A `GenerateContentResponse`; `final=False` leaves out `finishReason` (a mid-stream chunk)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    return {"candidates": [candidate], "usageMetadata": usage(counts), "modelVersion": model}


def stream_events(parts: list[dict[str, Any]], model: str, counts: Usage) -> list[bytes]:
    """The SSE events of a streamed reply (see the module docstring)."""
    thoughts = [part for part in parts if part.get(_THOUGHT)]
    answer = [part for part in parts if not part.get(_THOUGHT)]
    if len(answer) != 1 or not set(answer[0]) <= {"text", SIGNATURE_FIELD}:
        return [sse_event(reply(parts, model, counts))]
    events = []
    if thoughts:
        events.append(sse_event(reply(thoughts, model, counts._replace(candidates=0), final=False)))
    pieces = split_text(answer[0]["text"])
    for index, piece in enumerate(pieces):
        final = index == len(pieces) - 1
        chunk: dict[str, Any] = {"text": piece}
        if final and SIGNATURE_FIELD in answer[0]:
            chunk[SIGNATURE_FIELD] = answer[0][SIGNATURE_FIELD]
        so_far = counts._replace(candidates=count([{"text": "".join(pieces[: index + 1])}]))
        events.append(sse_event(reply([chunk], model, so_far, final=final)))
    return events


def split_text(text: str) -> list[str]:
    """`text` in at least two pieces of at most `STREAM_CHUNK_CHARS` (the last may be empty)."""
    pieces_count = max(2, math.ceil(len(text) / STREAM_CHUNK_CHARS))
    size = max(1, math.ceil(len(text) / pieces_count))
    pieces = [text[start : start + size] for start in range(0, len(text), size)]
    return pieces + [""] * (2 - len(pieces))


def sse_event(body: dict[str, Any]) -> bytes:
    """One server-sent event as `streamGenerateContent?alt=sse` frames it."""
    return f"data: {compact_json(body)}\r\n\r\n".encode()


def error(status: int, message: str | None = None, retry_delay_s: float | None = None) -> str:
    """The JSON text of an error body; a `retry_delay_s` adds a `RetryInfo` detail."""
    status_name, default_message = ERRORS[status]
    body: dict[str, Any] = {
        "code": status,
        "message": message or default_message,
        "status": status_name,
    }
    if retry_delay_s is not None:
        body["details"] = [{"@type": RETRY_INFO_TYPE, "retryDelay": duration(retry_delay_s)}]
    return json.dumps({"error": body})


def duration(seconds: float) -> str:
    """A protobuf `Duration` in its JSON form: 3 → "3s", 1.5 → "1.5s"."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds:g}s"

"""The Gemini REST wire format the fake speaks: response bodies, SSE chunks and error bodies.

Shapes follow what google-genai 2.34 parses (shared/notes/adk-genai.md §4, §5): camelCase keys,
`usageMetadata` on every reply, and errors as `{"error": {"code", "message", "status",
"details"}}` with `google.rpc.RetryInfo` in `details` for a 429.
"""

from __future__ import annotations

import json
from typing import Any

from testkit.gemini.tokens import compact_json

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


def usage(prompt_tokens: int, candidates_tokens: int) -> dict[str, int]:
    """The `usageMetadata` object of a reply."""
    return {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": candidates_tokens,
        "totalTokenCount": prompt_tokens + candidates_tokens,
    }


def reply(
    parts: list[dict[str, Any]], model: str, usage_metadata: dict[str, int], *, final: bool = True
) -> dict[str, Any]:
    """A `GenerateContentResponse`; `final=False` leaves out `finishReason` (a mid-stream chunk)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    return {"candidates": [candidate], "usageMetadata": usage_metadata, "modelVersion": model}


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

"""Sentry events and issues as `Issue`s.

Two event shapes occur: the SDK's (what `sentry_sdk` sends to the store endpoint:
`exception.values[]`, snake_case frames, `tags` as an object or `[key, value]` pairs) and the
web API's (`GET /api/0/projects/{org}/{project}/events/{id}/`: `entries[]` of typed blocks,
camelCase frames whose `context` is a list of `[lineno, line]` pairs, `tags` as `{key, value}`
objects). One reader handles both, preferring the SDK's spelling where both exist.

A chained exception has several values; the last one is what was raised, and its frames are
the issue's frames, oldest call first (Sentry's order). An event without an exception is
refused: there is no stack trace to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.control.intake.fields import Node, as_text, at, clean, kind, nonblank
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import Frame, Issue, IssueSource

_NO_EXCEPTION = (
    "a Sentry event needs exception.values[] with at least one exception; an event without "
    "one (a log message, a transaction) has no stack trace to start a fix from"
)
_NO_EVENT = (
    "a Sentry issue must carry its latest event under latestEvent; fetch it from "
    "/api/0/issues/{id}/events/latest/ and add it to the issue object"
)
_UNQUALIFIED_MODULES = frozenset({"builtins", "__builtin__", "__main__", "exceptions"})
"""Modules whose exception types are named without the module, as Python's tracebacks do."""

_ISSUE_EVENT_KEYS = ("latestEvent", "latest_event", "event")
"""Where a Sentry issue object may carry its latest event."""


def parse_event(payload: Mapping[str, Any]) -> Issue:
    """An `Issue` from a Sentry event in the SDK's or the web API's shape."""
    return _event_issue(Node(payload))


def _event_issue(event: Node) -> Issue:
    """The issue a Sentry event describes, read at `event.path`."""
    *earlier, raised = _exceptions(event)
    error_type, error_message = _error(raised)
    return Issue(
        source=IssueSource.SENTRY_EVENT,
        source_id=event.ident("event_id", "eventID", "id"),
        title=nonblank(event.text("title")) or _describe(raised),
        error_type=error_type,
        error_message=error_message,
        frames=_frames(raised),
        culprit=_culprit(event, raised),
        level=event.text("level"),
        platform=event.text("platform"),
        tags=_tags(event),
        body=_body(_message(event), earlier),
    )


def parse_issue(payload: Mapping[str, Any]) -> Issue:
    """An `Issue` from a Sentry issue object carrying its latest event.

    The title, culprit and links are the issue's; the error and frames are the event's.
    """
    issue = Node(payload)
    found = issue.find(*_ISSUE_EVENT_KEYS)
    if found is None:
        raise IntakeError(_NO_EVENT, "latestEvent")
    event_path, event_data = found
    event = _event_issue(Node.of(event_data, event_path))
    metadata = issue.node("metadata") or Node({}, "metadata")
    permalink = issue.link("permalink")
    return event.model_copy(
        update={
            "source": IssueSource.SENTRY_ISSUE,
            "source_id": issue.ident("shortId") or issue.ident("id") or event.source_id,
            "title": nonblank(issue.text("title")) or event.title,
            "error_type": event.error_type or metadata.text("type"),
            "error_message": event.error_message or metadata.text("value"),
            "culprit": nonblank(issue.text("culprit")) or event.culprit,
            "level": issue.text("level") or event.level,
            "platform": issue.text("platform") or event.platform,
            "links": [permalink, *event.links] if permalink else event.links,
        }
    )


def _exceptions(event: Node) -> list[Node]:
    """The exception values of the chain, oldest first; refused when there are none."""
    found = event.find("exception")
    if found is not None:
        path, value = found
        # The protocol also allows the list of values in place of `{"values": [...]}`.
        values = Node({"values": value}, path) if isinstance(value, list) else Node.of(value, path)
    else:
        values = _entry(event, "exception") or Node({}, at(event.path, "exception"))
    exceptions = values.nodes("values")
    if not exceptions:
        raise IntakeError(_NO_EXCEPTION, at(event.path, "exception"))
    return exceptions


def _entry(event: Node, entry_type: str) -> Node | None:
    """The `data` of the web API's first entry of type `entry_type`."""
    for entry in event.nodes("entries"):
        if entry.text("type") == entry_type:
            return entry.node("data")
    return None


def _error(exception: Node) -> tuple[str | None, str | None]:
    """The exception's type, qualified by its module as Python prints it, and its value."""
    error_type, value = exception.text("type"), exception.text("value")
    if not (nonblank(error_type) or nonblank(value)):
        raise IntakeError("an exception needs a type or a value", exception.path)
    module = exception.text("module")
    if error_type and module and "." not in error_type and module not in _UNQUALIFIED_MODULES:
        error_type = f"{module}.{error_type}"
    return error_type, value


def _frames(exception: Node) -> list[Frame]:
    stacktrace = exception.node("stacktrace")
    if stacktrace is None:
        return []
    frames = (_frame(frame) for frame in stacktrace.nodes("frames"))
    return [frame for frame in frames if frame is not None]


def _culprit(event: Node, raised: Node) -> str | None:
    """The event's culprit or transaction; else, as Sentry derives it, `<module> in <function>`
    of the innermost in-app frame (the SDK leaves the culprit to the server)."""
    named = nonblank(event.text("culprit")) or nonblank(event.text("transaction"))
    if named or (stacktrace := raised.node("stacktrace")) is None:
        return named
    for frame in reversed(stacktrace.nodes("frames")):
        where = nonblank(frame.text("module")) or nonblank(frame.text("filename"))
        if frame.flag("in_app", "inApp") and where:
            return f"{where} in {frame.text('function') or '?'}"
    return None


def _frame(frame: Node) -> Frame | None:
    """One frame, or `None` when it names no file at all."""
    file = (
        nonblank(frame.text("filename"))
        or nonblank(frame.text("abs_path", "absPath"))
        or nonblank(frame.text("module"))
    )
    if file is None:
        return None
    line = frame.integer("lineno", "lineNo")
    line = line if line is not None and line > 0 else None
    return Frame(
        file=file,
        line=line,
        function=frame.text("function"),
        context_line=_context_line(frame, line),
        in_app=bool(frame.flag("in_app", "inApp")),
    )


def _context_line(frame: Node, line: int | None) -> str | None:
    """The SDK's `context_line`, or the web API's `context` pair whose number is `line`."""
    direct = frame.text("context_line")
    if direct is not None or line is None:
        return direct
    for path, pair in frame.items("context"):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)):
            raise IntakeError(f"expected a [line number, source line] pair, got {kind(pair)}", path)
        if pair[0] == line:
            return as_text(pair[1], at(path, 1))
    return None


def _tags(event: Node) -> dict[str, str]:
    """Tags given as an object, as `[key, value]` pairs or as `{key, value}` objects."""
    found = event.find("tags")
    if found is None:
        return {}
    path, value = found
    if isinstance(value, dict):
        pairs = [(at(path, key), key, tag) for key, tag in value.items()]
    else:
        pairs = [_tag_pair(item_path, item) for item_path, item in event.items("tags")]
    tags = {clean(key).strip(): _tag_value(tag, item_path) for item_path, key, tag in pairs}
    return {key: tag for key, tag in tags.items() if key and tag is not None}


def _tag_pair(path: str, item: Any) -> tuple[str, str, Any]:
    if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
        return path, item[0], item[1]
    if isinstance(item, dict) and isinstance(item.get("key"), str):
        return path, item["key"], item.get("value")
    raise IntakeError(
        f"expected a [key, value] pair or a {{key, value}} object, got {kind(item)}", path
    )


def _tag_value(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return clean(str(value))
    raise IntakeError(f"expected a tag value (a string), got {kind(value)}", path)


def _message(event: Node) -> str | None:
    """The log message an event carries besides its exception (`logging.exception(...)`)."""
    direct = event.text("message") if isinstance(event.data.get("message"), str) else None
    nested = None if direct is not None else event.node("message")
    return (
        _formatted(event.node("logentry"))
        or nonblank(direct)
        or _formatted(nested)
        or _formatted(_entry(event, "message"))
    )


def _formatted(message: Node | None) -> str | None:
    return nonblank(message.text("formatted", "message")) if message else None


def _describe(exception: Node) -> str:
    """`Type: first line of the value`, or whichever of the two there is."""
    value = nonblank(exception.text("value"))
    parts = (nonblank(exception.text("type")), value.splitlines()[0] if value else None)
    return ": ".join(part for part in parts if part)


def _body(message: str | None, earlier: list[Node]) -> str | None:
    """The log message, then the exceptions the raised one was chained to."""
    parts = [message] if message else []
    chain = "\n".join(f"  {text}" for exception in earlier if (text := _describe(exception)))
    if chain:
        parts.append(f"Earlier exceptions in the chain, oldest first:\n{chain}")
    return "\n\n".join(parts) or None

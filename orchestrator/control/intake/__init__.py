"""Intake: an error report in, an `Issue` out, or a refusal whose message names the field.

Accepted reports, recognised by `detect_source` unless the caller names the source:

- a Sentry event, in the SDK's shape or the web API's (`orchestrator.control.intake.sentry`);
- a Sentry issue object carrying its latest event (`orchestrator.control.intake.sentry`);
- a GitHub issue object or `issues` webhook payload (`orchestrator.control.intake.github`);
- a pull request: a GitHub pull request object or `pull_request` webhook payload, or a small
  JSON naming a repository, a number, a base and a head (`orchestrator.control.intake.pull`);
- plain text (`orchestrator.control.intake.text`), unless the caller asks for JSON only
  (`json_only`: what a payload file holds, so that a file given by mistake is refused rather
  than read as a report).

What is kept is bounded by `IntakeLimits` (`orchestrator.control.intake.limits`). Intake only reads
and validates: it writes nothing anywhere.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.control.intake.fields import clean, kind
from orchestrator.control.intake.github import parse_github
from orchestrator.control.intake.limits import IntakeLimits, apply_limits, cut
from orchestrator.control.intake.pull import looks_like_pull_request, parse_pull_request
from orchestrator.control.intake.sentry import parse_event, parse_issue
from orchestrator.control.intake.text import parse_text
from orchestrator.core.errors import IntakeError, NotJsonError, PayloadTooLargeError
from orchestrator.core.models import Issue, IssueSource

__all__ = ["DEFAULT_LIMITS", "IntakeLimits", "detect_source", "parse_payload"]

DEFAULT_LIMITS = IntakeLimits()

_SHAPES = (
    "a Sentry event (with exception.values[] or entries[]), a Sentry issue carrying its latest "
    "event (latestEvent), a GitHub issue object (number, title, html_url), a GitHub `issues` "
    "webhook payload (action, issue), or a pull request (a GitHub pull request or its "
    "`pull_request` webhook payload, or {number, base, head, repository})"
)
_SENTRY_ISSUE_KEYS = frozenset({"latestEvent", "latest_event", "shortId"})
_SENTRY_EVENT_KEYS = frozenset({"exception", "entries", "event_id", "eventID", "sdk", "logentry"})
_GITHUB_URL = re.compile(r"github|/repos/", re.IGNORECASE)

_PARSERS: dict[IssueSource, Callable[[Mapping[str, Any]], Issue]] = {
    IssueSource.SENTRY_EVENT: parse_event,
    IssueSource.SENTRY_ISSUE: parse_issue,
    IssueSource.GITHUB: parse_github,
    IssueSource.PULL_REQUEST: parse_pull_request,
}


def parse_payload(
    data: bytes | str,
    source: IssueSource | None = None,
    *,
    limits: IntakeLimits = DEFAULT_LIMITS,
    json_only: bool = False,
) -> Issue:
    """The `Issue` an error report describes.

    `data` is UTF-8 bytes or text. With `source` None, text that starts with `{` or `[` must
    be a JSON object of a recognised shape and anything else is plain text; a named source is
    parsed as that source (`IssueSource.TEXT` takes even JSON as text). With `json_only`, plain
    text is refused, whatever `source` says.

    Raises:
        PayloadTooLargeError: `data` is over `limits.max_payload_bytes` (checked first).
        NotJsonError: `json_only` and `data` is not JSON (or `source` is `IssueSource.TEXT`).
        IntakeError: the report is malformed, empty or of no accepted shape; `field` names the
            offending field as a dotted path where there is one.
    """
    source = _source(source)
    text = _decode(data, limits.max_payload_bytes)
    as_text = source == IssueSource.TEXT or (
        source is None and not text.lstrip().startswith(("{", "["))
    )
    if as_text and json_only:
        raise NotJsonError(f"not a JSON payload ({_opening(text)}); send {_SHAPES}")
    if as_text:
        return apply_limits(parse_text(text), limits)
    payload = _load_object(text)
    return apply_limits(_PARSERS[source or detect_source(payload)](payload), limits)


def detect_source(payload: Mapping[str, Any]) -> IssueSource:
    """Which source a JSON object comes from, judged by its keys."""
    keys = payload.keys()
    permalink = payload.get("permalink")
    if keys & _SENTRY_ISSUE_KEYS or (isinstance(permalink, str) and "sentry" in permalink.lower()):
        return IssueSource.SENTRY_ISSUE
    if looks_like_pull_request(payload):
        return IssueSource.PULL_REQUEST
    if _looks_like_github(payload):
        return IssueSource.GITHUB
    if keys & _SENTRY_EVENT_KEYS:
        return IssueSource.SENTRY_EVENT
    raise IntakeError(
        f"unrecognised JSON object (keys: {_key_list(payload)}); send {_SHAPES}, "
        "or name the source explicitly"
    )


def _looks_like_github(payload: Mapping[str, Any]) -> bool:
    if "action" in payload and ("issue" in payload or "pull_request" in payload):
        return True
    urls = (payload.get(key) for key in ("html_url", "repository_url"))
    return "number" in payload and any(isinstance(u, str) and _GITHUB_URL.search(u) for u in urls)


def _source(source: IssueSource | str | None) -> IssueSource | None:
    if source is None or isinstance(source, IssueSource):
        return source
    try:
        return IssueSource(source)
    except ValueError:
        names = ", ".join(s.value for s in IssueSource)
        raise IntakeError(f"unknown source {source!r}; use one of {names}", "source") from None


def _decode(data: bytes | str, max_bytes: int) -> str:
    """`data` as text without a byte-order mark, once its size is known to be within bounds."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"the payload is {size:,} bytes, over the intake limit of {max_bytes:,} bytes; "
            "send a smaller report (the stack trace and the message are what matter)"
        )
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise IntakeError(
            f"the payload is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}: {exc.reason}); send UTF-8 text or JSON"
        ) from exc


def _load_object(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntakeError(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError as exc:
        raise IntakeError("the JSON is nested too deeply to read") from exc
    except ValueError as exc:  # the only other ValueError: more digits than int() accepts
        limit = sys.get_int_max_str_digits()
        raise IntakeError(
            f"the JSON holds a number too long to read (over {limit:,} digits)"
        ) from exc
    if not isinstance(payload, dict):
        raise IntakeError(f"expected a JSON object, got {kind(payload)}; send {_SHAPES}")
    return payload


def _opening(text: str, shown: int = 40) -> str:
    """How `text` begins, for a message: `it begins '# Baton…'`."""
    words = " ".join(clean(text).split())
    if not words:
        return "it is blank"
    return f"it begins {(words[:shown] + '…' if len(words) > shown else words)!r}"


def _key_list(payload: Mapping[str, Any], shown: int = 12) -> str:
    keys = [repr(cut(clean(str(key)), 40)) for key in list(payload)[:shown]]
    more = f" and {len(payload) - shown} more" if len(payload) > shown else ""
    return (", ".join(keys) or "none") + more

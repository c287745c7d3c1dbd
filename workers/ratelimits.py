"""How long a provider's 429 asks to wait, read from its response headers.

Every provider says it differently; all of it becomes one number of seconds, the countdown of
the stage's Celery retry and the fleet's cooldown (`workers.governed`). The headers read, first
that gives a delay wins:

1. `retry-after-ms` (OpenAI): milliseconds.
2. `retry-after` (HTTP, OpenAI, Anthropic): seconds, or an HTTP date.
3. The reset of the limit that ran out: OpenAI's `x-ratelimit-reset-requests` and
   `x-ratelimit-reset-tokens` are durations (`1s`, `6m0s`, `20ms`, `1h2m3.5s`); Anthropic's
   `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` are RFC 3339 times.
   A limit ran out when its `…-remaining` header says 0; when none says so (or none is sent),
   the latest of the resets, which waits long enough for whichever limit it was.

Gemini's `google.rpc.RetryInfo` is in the body, not a header (`workers.gemini.retry_delay_s`).
A header LiteLLM forwards with its `llm_provider-` prefix counts as the header itself. A value
that cannot be read is ignored, never guessed at; a time already past is a delay of 0.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime

FORWARDED_PREFIX = "llm_provider-"
"""How LiteLLM names a provider's header it passes on among its own."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

_OPENAI_LIMITS = ("requests", "tokens")
_ANTHROPIC_LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")


def delay_s(headers: Mapping[str, str], now_s: float | None = None) -> float | None:
    """Seconds the 429 whose response carried `headers` asks to wait; None if it says nothing
    readable. `now_s` is the time the dates are measured from (default: now)."""
    now = time.time() if now_s is None else now_s
    given = _lowercase(headers)
    millis = seconds(given.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    after = retry_after_s(given.get("retry-after"), now)
    if after is not None:
        return after
    return _reset_s(given, now)


def retry_after_s(value: str | None, now_s: float | None = None) -> float | None:
    """A `Retry-After` value in seconds: a number of seconds, or an HTTP date (its time from
    `now_s`, at least 0); None when it is neither."""
    if not value:
        return None
    number = seconds(value)
    if number is not None:
        return number
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # `-0000`: an HTTP date is in GMT all the same
        when = when.replace(tzinfo=UTC)
    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


def duration_s(value: str | None) -> float | None:
    """A duration as OpenAI writes it (`1s`, `6m0s`, `20ms`, `1h2m3.5s`) in seconds; None when
    it is not one."""
    text = (value or "").strip()
    if not text:
        return None
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def instant_s(value: str | None, now_s: float | None = None) -> float | None:
    """Seconds from `now_s` until an RFC 3339 time (`2026-12-01T10:00:30Z`), at least 0; None
    when it is not one (or names no zone)."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    now = time.time() if now_s is None else now_s
    return max(0.0, when.timestamp() - now)


def seconds(text: str | None) -> float | None:
    """A non-negative number, else None."""
    try:
        value = float((text or "").strip())
    except ValueError:
        return None
    return value if value >= 0 and value == value and value != float("inf") else None


def _reset_s(headers: Mapping[str, str], now_s: float) -> float | None:
    """The reset of the limit that ran out, else the latest reset given."""
    resets: list[tuple[float, bool]] = []
    for limit in _OPENAI_LIMITS:
        reset = duration_s(headers.get(f"x-ratelimit-reset-{limit}"))
        if reset is not None:
            resets.append((reset, headers.get(f"x-ratelimit-remaining-{limit}") == "0"))
    for limit in _ANTHROPIC_LIMITS:
        reset = instant_s(headers.get(f"anthropic-ratelimit-{limit}-reset"), now_s)
        if reset is not None:
            resets.append((reset, headers.get(f"anthropic-ratelimit-{limit}-remaining") == "0"))
    if not resets:
        return None
    exhausted = [reset for reset, out in resets if out]
    return max(exhausted or [reset for reset, _ in resets])


def _lowercase(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers by lower-case name, a forwarded `llm_provider-` one under its own name
    unless the header itself is there too."""
    plain: dict[str, str] = {}
    forwarded: dict[str, str] = {}
    for name, value in headers.items():
        key = str(name).lower()
        if key.startswith(FORWARDED_PREFIX):
            forwarded[key.removeprefix(FORWARDED_PREFIX)] = str(value)
        else:
            plain[key] = str(value)
    return {**forwarded, **plain}

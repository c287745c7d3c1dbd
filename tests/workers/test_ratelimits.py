"""Every provider's rate-limit headers read as one delay in seconds (no network involved)."""

from __future__ import annotations

import email.utils

import pytest

from workers.ratelimits import delay_s, duration_s, instant_s, retry_after_s

NOW = 1_796_000_000.0
"""A fixed clock (late November 2026), for the dates."""


def http_date(offset_s: float) -> str:
    return email.utils.formatdate(NOW + offset_s, usegmt=True)


def rfc3339(offset_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(NOW + offset_s, UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0.5s", 0.5),
     ("17ms", 0.017), ("2m30s", 150.0)],
)  # fmt: skip
def test_openai_durations_read_as_seconds(value: str, expected: float) -> None:
    assert duration_s(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "soon", "6 m", "5", "1s2", "-1s", "1d", "s"])
def test_what_is_not_a_duration_is_ignored(value: str) -> None:
    assert duration_s(value) is None


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert retry_after_s("7", NOW) == 7.0
    assert retry_after_s("1.5", NOW) == 1.5
    assert retry_after_s(http_date(20), NOW) == pytest.approx(20.0)
    assert retry_after_s(http_date(-30), NOW) == 0.0  # already past: go now
    assert retry_after_s("tomorrow", NOW) is None
    assert retry_after_s("-3", NOW) is None


def test_an_rfc3339_reset_is_the_time_until_it() -> None:
    assert instant_s(rfc3339(12.5), NOW) == pytest.approx(12.5)
    assert instant_s("2026-11-30T10:00:00+01:00", NOW) is not None
    assert instant_s("2026-11-30T10:00:00", NOW) is None  # no zone: not RFC 3339
    assert instant_s(rfc3339(-5), NOW) == 0.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # OpenAI-compatible
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),  # the finer one wins
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        (
            {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "12",
             "x-ratelimit-reset-tokens": "1s", "x-ratelimit-remaining-tokens": "0"},
            1.0,
        ),  # the tokens ran out: their reset, not the requests'
        (
            {"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "45s"},
            45.0,
        ),  # nothing says which ran out: the later reset
        ({"retry-after": "4", "x-ratelimit-reset-requests": "6m0s"}, 4.0),
        # Anthropic
        ({"retry-after": "9"}, 9.0),
        ({"anthropic-ratelimit-requests-reset": "@30"}, 30.0),
        (
            {"anthropic-ratelimit-requests-reset": "@50",
             "anthropic-ratelimit-requests-remaining": "7",
             "anthropic-ratelimit-output-tokens-reset": "@8",
             "anthropic-ratelimit-output-tokens-remaining": "0"},
            8.0,
        ),
        (
            {"anthropic-ratelimit-input-tokens-reset": "@5",
             "anthropic-ratelimit-tokens-reset": "@15"},
            15.0,
        ),
        ({"retry-after": "2", "anthropic-ratelimit-tokens-reset": "@60"}, 2.0),
        # forwarded by LiteLLM under its prefix
        ({"llm_provider-retry-after": "6"}, 6.0),
        ({"llm_provider-retry-after": "6", "retry-after": "2"}, 2.0),
        # nothing readable
        ({}, None),
        ({"retry-after": "later", "x-ratelimit-reset-requests": "soon"}, None),
    ],
)  # fmt: skip
def test_each_providers_headers_give_the_delay(
    headers: dict[str, str], expected: float | None
) -> None:
    given = {
        name: rfc3339(float(value[1:])) if value.startswith("@") else value
        for name, value in headers.items()
    }
    delay = delay_s(given, NOW)
    assert delay == (None if expected is None else pytest.approx(expected))


def test_an_http_date_retry_after_counts_from_now() -> None:
    assert delay_s({"Retry-After": http_date(90)}, NOW) == pytest.approx(90.0)

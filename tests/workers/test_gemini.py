"""Classification of model-call failures and the 429 countdown (no network involved)."""

from __future__ import annotations

import asyncio
import email.utils
import ssl
import time

import httpx
import pytest
from google.genai import errors

from orchestrator.core.models import StageRecord
from orchestrator.core.settings import ModelConfig, RetryConfig
from workers import gemini
from workers.errors import ModelRejectedError, ModelUnavailableError, RateLimitedError
from workers.gemini import build_model, close_model, model_error, retry_delay_s
from workers.governed import rate_limit_countdown


def rate_limited(
    details: list[dict[str, str]] | None = None, headers: dict[str, str] | None = None
) -> errors.ClientError:
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted",
            "status": "RESOURCE_EXHAUSTED",
            "details": details or [],
        }
    }
    response = httpx.Response(429, headers=headers or {}, json=body)
    return errors.ClientError(429, body, response)


RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


@pytest.mark.parametrize(
    ("details", "headers", "expected"),
    [
        ([{"@type": RETRY_INFO, "retryDelay": "31s"}], {}, 31.0),
        (
            [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
                {"@type": RETRY_INFO, "retryDelay": "1.5s"},
            ],
            {},
            1.5,
        ),
        ([], {"Retry-After": "7"}, 7.0),
        ([{"@type": RETRY_INFO, "retryDelay": "2s"}], {"Retry-After": "9"}, 2.0),
        ([], {}, None),
        ([{"@type": RETRY_INFO, "retryDelay": "soon"}], {}, None),
    ],
)
def test_retry_delay_comes_from_retry_info_then_retry_after(details, headers, expected) -> None:
    assert retry_delay_s(rate_limited(details, headers)) == expected


def test_retry_after_may_be_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 20, usegmt=True)
    delay = retry_delay_s(rate_limited([], {"Retry-After": when}))
    assert delay is not None and 18 <= delay <= 21


def test_429_becomes_a_rate_limit_with_the_servers_delay() -> None:
    mapped = model_error(rate_limited([{"@type": RETRY_INFO, "retryDelay": "3s"}]))
    assert isinstance(mapped, RateLimitedError)
    assert mapped.delay_s == 3.0
    assert "429 RESOURCE_EXHAUSTED" in str(mapped)


@pytest.mark.parametrize(
    ("code", "status"),
    [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (403, "PERMISSION_DENIED")],
)
def test_client_errors_fail_at_once_with_a_clear_message(code: int, status: str) -> None:
    body = {"error": {"code": code, "message": "API key not valid", "status": status}}
    mapped = model_error(errors.ClientError(code, body))
    assert isinstance(mapped, ModelRejectedError)
    assert f"{code} {status}: API key not valid" in str(mapped)
    assert "GOOGLE_API_KEY" in str(mapped)


@pytest.mark.parametrize(
    "exc",
    [
        errors.ServerError(
            503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "overloaded"}}
        ),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("dropped"),
    ],
)
def test_transient_failures_that_outlast_backoff_are_unavailability(exc: Exception) -> None:
    assert isinstance(model_error(exc), ModelUnavailableError)


def test_other_exceptions_are_not_model_failures() -> None:
    assert model_error(KeyError("x")) is None


def test_countdown_is_the_delay_plus_small_positive_jitter() -> None:
    cfg = RetryConfig(rate_limit_jitter_s=1.0)
    countdowns = [
        rate_limit_countdown(RateLimitedError("429", 3.0), StageRecord(), cfg) for _ in range(200)
    ]
    assert all(c is not None and 3.0 <= c <= 4.0 for c in countdowns)
    assert len(set(countdowns)) > 1


def test_countdown_without_a_delay_backs_off_exponentially() -> None:
    cfg = RetryConfig(rate_limit_jitter_s=0.0, rate_limit_fallback_s=10.0)
    waits = [
        rate_limit_countdown(RateLimitedError("429"), StageRecord(rate_limit_retries=n), cfg)
        for n in range(5)
    ]
    assert waits == [10.0, 20.0, 40.0, 80.0, 120.0]


def test_countdown_gives_up_after_the_retry_and_wait_budgets() -> None:
    cfg = RetryConfig(rate_limit_max_retries=3, rate_limit_max_wait_s=60.0)
    assert (
        rate_limit_countdown(RateLimitedError("429", 1.0), StageRecord(rate_limit_retries=3), cfg)
        is None
    )
    assert (
        rate_limit_countdown(
            RateLimitedError("429", 30.0), StageRecord(rate_limit_wait_s=40.0), cfg
        )
        is None
    )
    assert (
        rate_limit_countdown(
            RateLimitedError("429", 10.0), StageRecord(rate_limit_wait_s=40.0), cfg
        )
        is not None
    )


def test_every_stages_model_client_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    gemini.tls_context.cache_clear()
    cfg = ModelConfig(base_url="http://127.0.0.1:9", api_key="k")  # type: ignore[arg-type]

    async def one_stage() -> None:
        model = build_model(cfg, RetryConfig())
        assert model.api_client is not None  # the client is made in the stage's event loop
        await close_model(model)

    for _ in range(3):  # each stage runs in an event loop of its own
        asyncio.run(one_stage())

    assert len(made) == 1
    assert made[0] is gemini.tls_context()
    assert made[0].verify_mode is ssl.CERT_REQUIRED and made[0].check_hostname


def test_an_unreachable_model_names_the_host_it_tried() -> None:
    request = httpx.Request("POST", "https://gemini.example.invalid:8443/v1beta/models/m")
    failure = httpx.ConnectError("[Errno -2] Name or service not known", request=request)

    message = str(model_error(failure))

    assert message.startswith("model unreachable at https://gemini.example.invalid:8443 ")
    assert "Name or service not known" in message


def test_a_missing_key_with_a_base_url_says_the_url_is_set_and_what_it_needs() -> None:
    with_url = ModelConfig(base_url="http://127.0.0.1:8765")

    with pytest.raises(ModelRejectedError) as caught:
        build_model(with_url, RetryConfig())

    assert "BATON_GEMINI_BASE_URL is http://127.0.0.1:8765" in str(caught.value)
    assert "(or BATON_GEMINI_BASE_URL" not in str(caught.value)
    assert "GOOGLE_API_KEY=fake" in str(caught.value)


def test_a_missing_key_without_a_base_url_points_at_the_fake_server() -> None:
    said = gemini.missing_key_message(ModelConfig())

    assert said.startswith("no Gemini API key: set GOOGLE_API_KEY, or run without one")
    assert "`baton fake-gemini --port 8765 &`" in said
    assert "BATON_GEMINI_BASE_URL=http://127.0.0.1:8765 GOOGLE_API_KEY=fake" in said
    assert "`make demo`" in said


def test_gemini_calls_go_through_httpx_though_aiohttp_is_installed() -> None:
    """LiteLLM brings aiohttp, which google-genai would take for its async calls; Baton keeps it
    on httpx, whose dropped connection is the transient failure `model_error` knows."""
    import aiohttp  # installed: the case this test is about
    from google.adk.models.llm_request import LlmRequest
    from google.genai import types

    from testkit.gemini import FakeGemini

    assert aiohttp.__version__
    with FakeGemini.start({"agents": {"*": [{"text": "ok"}]}, "faults": [{"drop": True}]}) as fake:
        cfg = ModelConfig(base_url=fake.url, api_key="k")  # type: ignore[arg-type]
        model = build_model(cfg, RetryConfig(transient_attempts=1))
        request = LlmRequest(
            model=cfg.name, contents=[types.Content(role="user", parts=[types.Part(text="hi")])]
        )

        async def call() -> None:
            try:
                [_ async for _ in model.generate_content_async(request)]
            finally:
                await close_model(model)

        with pytest.raises(httpx.TransportError) as dropped:
            asyncio.run(call())
        statuses = [entry["status"] for entry in fake.requests()]

    assert isinstance(model_error(dropped.value), ModelUnavailableError)
    assert statuses == [0]

"""Gemini through google-genai, with every retry decision made by Baton.

google-genai's and ADK's own retries are switched off: they ignore the server's `retryDelay`.
Instead:

* 429 → `RateLimitedError(delay_s)`; the Celery task puts the stage back on its queue with a
  countdown of that delay (shared/notes/adk-genai.md §5).
* 5xx, timeouts and dropped connections → retried here with tenacity (exponential backoff with
  jitter, bounded), but only before the first chunk of a reply arrived.
* 400/401/403/404 → `ModelRejectedError`, at once.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
from google.adk.models.google_llm import Gemini
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import errors as genai_errors
from google.genai import types
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from orchestrator.models import StageRecord
from orchestrator.settings import ModelConfig, RetryConfig
from workers.errors import ModelRejectedError, ModelUnavailableError, RateLimitedError

logger = logging.getLogger(__name__)

_TRANSIENT_HTTP = (httpx.TimeoutException, httpx.TransportError, TimeoutError)
RATE_LIMIT_BACKOFF_CAP_S = 120.0


class BatonGemini(Gemini):
    """`Gemini` whose transient failures are retried with bounded, jittered backoff."""

    transient_attempts: int = 4
    transient_initial_s: float = 0.5
    transient_max_s: float = 20.0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        started = False

        def retryable(exc: BaseException) -> bool:
            return not started and is_transient(exc)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.transient_attempts),
            wait=wait_exponential_jitter(
                initial=self.transient_initial_s,
                max=self.transient_max_s,
                jitter=self.transient_initial_s,
            ),
            retry=retry_if_exception(retryable),
            before_sleep=_log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                async for response in super().generate_content_async(llm_request, stream):
                    started = True
                    yield response


def _log_retry(state: Any) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.warning(
        "model call failed transiently (%s); attempt %d, retrying",
        _describe(exc),
        state.attempt_number,
    )


def build_model(cfg: ModelConfig, retry: RetryConfig) -> BatonGemini:
    """A Gemini model on the real google-genai client, with the client's own retries off."""
    if cfg.api_key is None:
        raise ModelRejectedError(
            "no Gemini API key: set GOOGLE_API_KEY (or BATON_GEMINI_BASE_URL to a fake server)"
        )
    http_options: dict[str, Any] = {"timeout": int(cfg.timeout_s * 1000)}
    return BatonGemini(
        model=cfg.name,
        base_url=cfg.base_url,
        api_version="v1beta" if cfg.base_url else None,
        client_kwargs={"api_key": cfg.api_key.get_secret_value(), "http_options": http_options},
        retry_options=types.HttpRetryOptions(attempts=1),
        transient_attempts=retry.transient_attempts,
        transient_initial_s=retry.transient_initial_s,
        transient_max_s=retry.transient_max_s,
    )


async def close_model(model: Gemini) -> None:
    """Close the model's HTTP client inside the event loop that used it."""
    await model.api_client.aio.aclose()


def is_transient(exc: BaseException) -> bool:
    """5xx, 408, timeouts and dropped connections."""
    if isinstance(exc, genai_errors.APIError):
        return exc.code >= 500 or exc.code == 408
    return isinstance(exc, _TRANSIENT_HTTP)


def classify(exc: BaseException) -> Exception | None:
    """Map a model-call failure to Baton's errors; None if it is not a model-call failure."""
    if isinstance(exc, genai_errors.APIError):
        if exc.code == 429:
            status = exc.status or "RESOURCE_EXHAUSTED"
            message = f"model rate limit (429 {status}): {_short(exc.message)}"
            return RateLimitedError(message, retry_delay_s(exc))
        if is_transient(exc):
            return ModelUnavailableError(f"model unavailable after retries: {_describe(exc)}")
        return ModelRejectedError(
            f"the model API refused the request ({_describe(exc)}); check GOOGLE_API_KEY, "
            "BATON_MODEL and the request"
        )
    if isinstance(exc, _TRANSIENT_HTTP):
        return ModelUnavailableError(f"model unreachable after retries: {_describe(exc)}")
    return None


def retry_delay_s(exc: genai_errors.APIError) -> float | None:
    """The server's `google.rpc.RetryInfo.retryDelay`, else its `Retry-After` header, in seconds."""
    details = (
        exc.details.get("error", {}).get("details", []) if isinstance(exc.details, dict) else []
    )
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
            "google.rpc.RetryInfo"
        ):
            delay = _seconds(str(detail.get("retryDelay", "")).removesuffix("s"))
            if delay is not None:
                return delay
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    return _retry_after(headers.get("retry-after") or headers.get("Retry-After"))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, genai_errors.APIError):
        return f"{exc.code} {exc.status or ''}: {_short(exc.message)}".replace("  ", " ")
    return f"{type(exc).__name__}: {_short(str(exc))}" if exc else "unknown error"


def _short(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "…"


def rate_limit_countdown(
    exc: RateLimitedError, record: StageRecord, cfg: RetryConfig
) -> float | None:
    """Seconds until the next attempt: the server's delay (or backoff) plus positive jitter.

    None when the stage has used up its retries or its total wait.
    """
    if record.rate_limit_retries >= cfg.rate_limit_max_retries:
        return None
    if exc.delay_s is not None:
        delay = exc.delay_s
    else:
        delay = min(
            RATE_LIMIT_BACKOFF_CAP_S, cfg.rate_limit_fallback_s * 2**record.rate_limit_retries
        )
    countdown = delay + random.uniform(0, cfg.rate_limit_jitter_s)
    if record.rate_limit_wait_s + countdown > cfg.rate_limit_max_wait_s:
        return None
    return round(countdown, 3)

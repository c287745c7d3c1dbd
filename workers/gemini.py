"""Gemini through google-genai, with every retry decision made by Baton.

google-genai's and ADK's own retries are switched off: they ignore the server's `retryDelay`.
Instead:

* Before every attempt, the fleet's `Governor` (optional) waits for the model's quota and any
  cooldown; after a reply it learns the real token count.
* 429 → the whole fleet cools down for the server's delay (`Governor.cooldown`). A stage that
  has made progress (a call already answered) waits a short delay out inside the call and
  sends it again, a few times at most; otherwise → `RateLimitedError(delay_s)`, and the Celery
  task puts the stage back on its queue with a countdown of that delay
  (shared/notes/adk-genai.md §5).
* 5xx, timeouts and dropped connections (what `model_error` calls `ModelUnavailableError`) →
  retried here with tenacity (exponential backoff with jitter, bounded), but only before the
  first chunk of a reply arrived.
* 400/401/403/404 → `ModelRejectedError`, at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncGenerator
from typing import Any

import certifi
import httpx
from google.adk.models.google_llm import Gemini
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import Client, types
from google.genai import errors as genai_errors
from pydantic import Field, PrivateAttr, SkipValidation
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from orchestrator.core.models import StageRecord
from orchestrator.core.settings import ModelConfig, RetryConfig
from workers import metrics
from workers.budget import request_tokens
from workers.errors import (
    ExecutionError,
    ModelRejectedError,
    ModelUnavailableError,
    RateLimitedError,
)
from workers.governor import JITTER_S, REASONS, Governor, Permit, WaitCallback

logger = logging.getLogger(__name__)

_TRANSIENT_HTTP = (httpx.TimeoutException, httpx.TransportError, TimeoutError)
RATE_LIMIT_BACKOFF_CAP_S = 120.0
COOLDOWN_FALLBACK_S = 5.0
"""The fleet's cooldown after a 429 that names no delay."""
MAX_INLINE_429S = 3
"""429s one stage waits out inside its model calls before it goes back on its queue."""


class BatonGemini(Gemini):
    """`Gemini` whose transient failures are retried with bounded, jittered backoff, and whose
    calls wait for the fleet's quota. One instance serves one stage execution."""

    transient_attempts: int = 4
    transient_initial_s: float = 0.5
    transient_max_s: float = 20.0
    governor: SkipValidation[Governor | None] = Field(default=None, exclude=True)
    """The fleet's quota and cooldown; None: calls go out at once, 429s cool only this stage."""
    inline_wait_max_s: float = 10.0
    """The longest wait slept inside a call; a longer one puts the stage back on its queue."""
    max_inline_429s: int = MAX_INLINE_429S
    on_wait: SkipValidation[WaitCallback | None] = Field(default=None, exclude=True)
    """Told the seconds about to be slept and why, so that the stage can show it."""
    stage: str = ""
    """The stage this model serves, for the metrics."""
    _waited_s: float = PrivateAttr(0.0)
    _answered: int = PrivateAttr(0)
    _inline_429s: int = PrivateAttr(0)

    @property
    def waited_s(self) -> float:
        """Time this model's calls have slept for quota, cooldowns and 429s so far."""
        return round(self._waited_s, 3)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        while True:
            yielded = False
            try:
                async for response in self._call_with_retries(llm_request, stream):
                    yielded = True
                    yield response
            except genai_errors.APIError as exc:
                if exc.code == 429:
                    metrics.rate_limited(self.model)
                if exc.code != 429 or yielded or not await self._wait_out_429(exc):
                    raise
            else:
                self._answered += 1
                return

    async def _call_with_retries(
        self, llm_request: LlmRequest, stream: bool
    ) -> AsyncGenerator[LlmResponse, None]:
        """One model call: permitted by the governor before every attempt, transient failures
        retried, the real token count reported after the reply."""
        started = False

        def retryable(exc: BaseException) -> bool:
            return not started and isinstance(model_error(exc), ModelUnavailableError)

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
                permit = await self._acquire(llm_request)
                metrics.model_call(self.model, self.stage)
                final: LlmResponse | None = None
                async for response in super().generate_content_async(llm_request, stream):
                    started = True
                    if response.usage_metadata is not None and not response.partial:
                        final = response
                    yield response
                if final is not None and final.usage_metadata is not None:
                    usage = final.usage_metadata
                    metrics.tokens_used(
                        self.model, self.stage,
                        prompt=usage.prompt_token_count or 0,
                        output=(usage.candidates_token_count or 0)
                        + (usage.thoughts_token_count or 0),
                    )  # fmt: skip
                if self.governor is not None and permit is not None and final is not None:
                    self.governor.reconcile(permit, _tokens(final))

    async def _acquire(self, llm_request: LlmRequest) -> Permit | None:
        """Wait for the fleet's quota and any cooldown (None without a governor)."""
        if self.governor is None:
            return None
        # The HTTP client is built first, so that the permit is taken as close as possible to
        # the request going out (the provider's window counts from its arrival).
        _ = self.api_client
        counted = self.governor.quota(self.model).tokens_per_minute is not None
        permit = await self.governor.acquire(
            self.model,
            request_tokens(llm_request) if counted else 0,  # estimated only where it counts
            max_sleep_s=self.inline_wait_max_s,
            on_wait=self.on_wait,
        )
        self._waited_s += permit.slept_s
        metrics.quota_wait(self.model, permit.slept_s)
        return permit

    async def _wait_out_429(self, exc: genai_errors.APIError) -> bool:
        """Cool the fleet down; True when this stage waits inside the call and sends it again
        (the next permit sleeps out the cooldown), False when the 429 should go to Celery."""
        delay_s = retry_delay_s(exc)
        cooldown_s = COOLDOWN_FALLBACK_S if delay_s is None else delay_s
        if self.governor is not None:
            self.governor.cooldown(self.model, cooldown_s)
        inline = (
            self._answered > 0
            and cooldown_s <= self.inline_wait_max_s
            and self._inline_429s < self.max_inline_429s
        )
        if not inline:
            return False
        self._inline_429s += 1
        logger.info(
            "model %s answered 429 mid-stage; waiting %.1fs inside the stage (%d of %d)",
            self.model, cooldown_s, self._inline_429s, self.max_inline_429s,
        )  # fmt: skip
        if self.governor is None:
            wait_s = cooldown_s + random.uniform(*JITTER_S)
            if self.on_wait is not None:
                self.on_wait(wait_s, REASONS["cooldown"])
            await asyncio.sleep(wait_s)
            self._waited_s += wait_s
            metrics.quota_wait(self.model, wait_s)
        return True


def _tokens(response: LlmResponse) -> int:
    """What a reply counts against a tokens-per-minute quota: its total (prompt, reply and
    thoughts), else the sum of the parts it gives."""
    usage = response.usage_metadata
    if usage is None:
        return 0
    if usage.total_token_count:
        return usage.total_token_count
    parts = (usage.prompt_token_count, usage.candidates_token_count, usage.thoughts_token_count)
    return sum(count or 0 for count in parts)


def _log_retry(state: Any) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.warning(
        "model call failed transiently (%s); attempt %d, retrying",
        _describe(exc),
        state.attempt_number,
    )


def build_model(
    cfg: ModelConfig,
    retry: RetryConfig,
    *,
    governor: Governor | None = None,
    on_wait: WaitCallback | None = None,
    stage: str = "",
    http_client: httpx.AsyncClient | None = None,
    client: Client | None = None,
) -> BatonGemini:
    """A Gemini model on the real google-genai client, with the client's own retries off;
    its calls wait for `governor`'s quota when one is given. `http_client` replaces the
    HTTP client google-genai would make (one with another transport, say); `client` is a
    google-genai client to share (`ModelClients`) instead of making one."""
    if cfg.api_key is None:
        raise ModelRejectedError(missing_key_message(cfg))
    behaviour: dict[str, Any] = {
        "model": cfg.name,
        "retry_options": types.HttpRetryOptions(attempts=1),
        "transient_attempts": retry.transient_attempts,
        "transient_initial_s": retry.transient_initial_s,
        "transient_max_s": retry.transient_max_s,
        "governor": governor,
        "inline_wait_max_s": retry.inline_wait_max_s,
        "on_wait": on_wait,
        "stage": stage,
    }
    if client is not None:
        return BatonGemini(client=client, **behaviour)
    tls = tls_context()
    http_options: dict[str, Any] = {
        "timeout": int(cfg.timeout_s * 1000),
        # httpx takes the context as `verify`, the client's websocket side as `ssl`.
        "client_args": {"verify": tls},
        "async_client_args": {"verify": tls, "ssl": tls},
    }
    if http_client is not None:
        http_options["httpx_async_client"] = http_client
    return BatonGemini(
        base_url=cfg.base_url,
        api_version="v1beta" if cfg.base_url else None,
        client_kwargs={"api_key": cfg.api_key.get_secret_value(), "http_options": http_options},
        **behaviour,
    )


class ModelClients:
    """The google-genai clients of one worker process, one per model configuration, shared by
    every stage it runs: made once (client construction and its two HTTP clients are a good
    part of a short stage's CPU time) and kept alive (its connections stay open from one stage
    to the next, so a stage does not open a TCP and TLS connection of its own).

    A client's HTTP connections belong to the event loop that first used them: a process that
    shares clients runs all its stages on one event loop (`workers.heartbeat.Interruptible`).
    """

    def __init__(self) -> None:
        self._clients: dict[ModelConfig, Client] = {}

    def get(self, cfg: ModelConfig, retry: RetryConfig) -> Client:
        """The client for `cfg`, made as `build_model` would make it the first time.

        Raises:
            ModelRejectedError: no API key is configured.
        """
        if cfg not in self._clients:
            self._clients[cfg] = build_model(cfg, retry).api_client
        return self._clients[cfg]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every model client of this process.

    Each stage makes a fresh client, and google-genai left alone builds two contexts per client,
    each loading the whole CA bundle: two thirds of a stage's CPU time when the model answers at
    once. The CAs are the ones it would choose: `SSL_CERT_FILE` and `SSL_CERT_DIR`, else
    certifi's."""
    return ssl.create_default_context(
        cafile=os.environ.get("SSL_CERT_FILE", certifi.where()),
        capath=os.environ.get("SSL_CERT_DIR"),
    )


async def close_model(model: Gemini) -> None:
    """Close the model's HTTP client inside the event loop that used it, unless it was given a
    shared one (`ModelClients`), which stays open for the next stage."""
    if model.client is None:
        await model.api_client.aio.aclose()


def missing_key_message(cfg: ModelConfig) -> str:
    """What to do when no API key is configured; the same words at a worker's start and in a
    run's reason."""
    if cfg.base_url:
        return (
            f"no Gemini API key: set GOOGLE_API_KEY (BATON_GEMINI_BASE_URL is {cfg.base_url}; "
            "a fake server takes any non-empty key)"
        )
    return "no Gemini API key: set GOOGLE_API_KEY"


def model_error(exc: BaseException) -> ExecutionError | None:
    """A model call's failure as Baton's error, which says how it is handled (a 429 goes back
    on the queue, a 5xx or a dropped connection is transient, a 400 is final); None if `exc`
    is not a model call's failure."""
    if isinstance(exc, genai_errors.APIError):
        if exc.code == 429:
            status = exc.status or "RESOURCE_EXHAUSTED"
            message = f"model rate limit (429 {status}): {_short(exc.message)}"
            return RateLimitedError(message, retry_delay_s(exc))
        if exc.code >= 500 or exc.code == 408:
            return ModelUnavailableError(f"model unavailable after retries: {_describe(exc)}")
        return ModelRejectedError(
            f"the model API refused the request ({_describe(exc)}); check GOOGLE_API_KEY, "
            "BATON_MODEL and the request"
        )
    if isinstance(exc, _TRANSIENT_HTTP):
        return ModelUnavailableError(
            f"model unreachable at {_host_of(exc)} after retries: {_describe(exc)}"
        )
    return None


def _host_of(exc: BaseException) -> str:
    """The host a failed HTTP request went to, from httpx's request when it kept one."""
    try:
        request = exc.request  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when it has none
        return "the model API"
    url = getattr(request, "url", None)
    return f"{url.scheme}://{url.netloc.decode()}" if url is not None else "the model API"


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

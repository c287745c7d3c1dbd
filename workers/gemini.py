"""Gemini through google-genai, with every retry decision made by Baton (`workers.governed`).

google-genai's and ADK's own retries are switched off: they ignore the server's `retryDelay`.
A 429's delay is its `google.rpc.RetryInfo.retryDelay`, else its `Retry-After`
(shared/notes/adk-genai.md §5); 5xx, timeouts and dropped connections are transient; other
4xx are final (`model_error`).
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
from collections.abc import AsyncGenerator
from typing import Any

import certifi
import httpx
from google.adk.models.google_llm import Gemini
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import Client, types
from google.genai import errors as genai_errors

from orchestrator.core.settings import ModelConfig, RetryConfig
from workers.errors import (
    ExecutionError,
    ModelRejectedError,
    ModelUnavailableError,
    RateLimitedError,
)
from workers.governed import GovernedLlm
from workers.governor import Governor, WaitCallback
from workers.ratelimits import retry_after_s, seconds

logger = logging.getLogger(__name__)

_TRANSIENT_HTTP = (httpx.TimeoutException, httpx.TransportError, TimeoutError)


class BatonGemini(GovernedLlm, Gemini):
    """`Gemini` whose calls wait for the fleet's quota and whose failures Baton retries
    (`GovernedLlm`). One instance serves one stage execution."""

    def failure(self, exc: BaseException) -> ExecutionError | None:
        return model_error(exc)

    def send(self, llm_request: LlmRequest, stream: bool) -> AsyncGenerator[LlmResponse, None]:
        return Gemini.generate_content_async(self, llm_request, stream)

    def describe(self, exc: BaseException) -> str:
        return _describe(exc)

    def prepare(self) -> None:
        _ = self.api_client


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
        # httpx takes the context as `verify`, the client's websocket side as `ssl`. A transport
        # of its own keeps google-genai on httpx where aiohttp is installed too (LiteLLM brings
        # it), so its failures stay the httpx errors `model_error` knows.
        "client_args": {"verify": tls},
        "async_client_args": {
            "verify": tls,
            "ssl": tls,
            "transport": httpx.AsyncHTTPTransport(verify=tls),
        },
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
    run's reason. Without a key, Baton runs on the fake Gemini server of its test kit."""
    if cfg.base_url:
        return (
            f"no Gemini API key: set GOOGLE_API_KEY (BATON_GEMINI_BASE_URL is {cfg.base_url}; "
            "a fake server takes any non-empty key, e.g. GOOGLE_API_KEY=fake)"
        )
    return f"no Gemini API key: set GOOGLE_API_KEY, {WITHOUT_A_KEY}"


WITHOUT_A_KEY = (
    "or run without one on the fake Gemini server: `baton fake-gemini --port 8765 &`, then "
    "BATON_GEMINI_BASE_URL=http://127.0.0.1:8765 GOOGLE_API_KEY=fake (`make demo` runs the "
    "whole fixer that way)"
)
"""How to run with no model key at all: the fake Gemini server (`testkit.gemini`)."""


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
            delay = seconds(str(detail.get("retryDelay", "")).removesuffix("s"))
            if delay is not None:
                return delay
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    return retry_after_s(headers.get("retry-after") or headers.get("Retry-After"))


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, genai_errors.APIError):
        return f"{exc.code} {exc.status or ''}: {_short(exc.message)}".replace("  ", " ")
    return f"{type(exc).__name__}: {_short(str(exc))}" if exc else "unknown error"


def _short(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "…"

"""Stages on other providers (OpenAI-compatible servers, Anthropic, Ollama, vLLM) through ADK's
`LiteLlm`, with every retry decision made by Baton (`workers.governed`).

Importing this module does not import LiteLLM (ADK's wrapper imports it on first use, and so
does `build_model` here): a worker whose stages all run on Gemini never loads it. The first
import is made quiet and local: LiteLLM's default of loading a `.env` file is off (ADK's
`LITELLM_MODE=PRODUCTION`), and its model price list and Anthropic header list are read from
the package rather than fetched from GitHub at every start (`LITELLM_LOCAL_MODEL_COST_MAP`,
`LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS`), each unless the operator set it otherwise.

Keys and base URLs come from the worker's settings (`ProviderConfig`) and go to LiteLLM as
arguments of each call, never through the environment, so a sandbox, a prompt or a log line
never sees them; LiteLLM's and the OpenAI client's own retries are off (`max_retries=0`).

A failed call becomes Baton's error here (`model_error`): a 429 is a `RateLimitedError` whose
delay is read from the response's headers (`workers.ratelimits`), 5xx, timeouts and dropped
connections are transient, any other 4xx is final. Token counts come from the provider's
`usage` as ADK maps it, made to mean what Gemini's do (`_as_gemini_usage`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
from google.adk.models import LlmCapabilities
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from pydantic import Field, PrivateAttr, SkipValidation

from orchestrator.core.providers import LITELLM_EXTRA, ModelRef, litellm_missing
from orchestrator.core.settings import ProviderConfig, RetryConfig
from workers.errors import (
    ExecutionError,
    ModelRejectedError,
    ModelUnavailableError,
    RateLimitedError,
    UnrunnableStageError,
)
from workers.governed import GovernedLlm
from workers.governor import Governor, WaitCallback
from workers.ratelimits import delay_s

logger = logging.getLogger(__name__)

LITELLM_ENVIRONMENT = {
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
}
"""Set (unless already set) before LiteLLM is first imported: no `.env` loading, no fetches."""
NEEDS_BASE_URL = {"hosted_vllm": "BATON_VLLM_BASE_URL"}
"""Providers that have no API of their own to fall back to, and the setting that names one."""
_TRANSIENT_HTTP = (httpx.TimeoutException, httpx.TransportError, TimeoutError)


@functools.cache
def import_litellm() -> Any:
    """LiteLLM, imported once, quietly and without fetching anything (module docstring)."""
    for name, value in LITELLM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        import litellm
    except ImportError as exc:
        raise UnrunnableStageError(
            f"this stage's model runs through LiteLLM, which is not installed here: {LITELLM_EXTRA}"
        ) from exc

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on every error
    return litellm


class BatonLiteLlm(GovernedLlm):
    """A LiteLLM model whose calls wait for the fleet's quota and whose failures Baton retries
    (`GovernedLlm`); it sends through ADK's `LiteLlm` (`inner`). One instance serves one stage
    execution."""

    inner: SkipValidation[BaseLlm] = Field(exclude=True)
    """ADK's wrapper, holding LiteLLM's call arguments (the key among them, never dumped)."""
    provider: str
    """The provider's prefix in the model id: `openai`, `anthropic`, …"""
    key_variable: str | None = None
    """Where the provider's key comes from, for messages (`OPENAI_API_KEY`)."""
    _secret: str | None = PrivateAttr(None)

    @property
    def capabilities(self) -> LlmCapabilities:
        return self.inner.capabilities

    def failure(self, exc: BaseException) -> ExecutionError | None:
        return model_error(exc, self.provider, self.key_variable, secret=self._secret)

    async def send(
        self, llm_request: LlmRequest, stream: bool
    ) -> AsyncGenerator[LlmResponse, None]:
        async for response in self.inner.generate_content_async(llm_request, stream):
            yield _as_gemini_usage(response)

    def given_up(self, exc: BaseException, failure: ExecutionError | None) -> BaseException:
        return exc if failure is None else failure  # LiteLLM's errors stay in this module

    def describe(self, exc: BaseException) -> str:
        failure = self.failure(exc)
        return failure.message if failure is not None else super().describe(exc)


def build_model(
    ref: ModelRef,
    cfg: ProviderConfig,
    retry: RetryConfig,
    *,
    governor: Governor | None = None,
    on_wait: WaitCallback | None = None,
    stage: str = "",
) -> BatonLiteLlm:
    """A model `ref` names on LiteLLM's real client, its key and base URL from `cfg`, with
    LiteLLM's own retries off; its calls wait for `governor`'s quota when one is given.

    Raises:
        ModelRejectedError: the provider's key, or a base URL it needs, is not configured.
    """
    problem = unusable(ref, cfg)
    if problem is not None:
        raise ModelRejectedError(problem)
    import_litellm()
    from google.adk.models.lite_llm import LiteLlm

    call: dict[str, Any] = {"timeout": cfg.timeout_s, "max_retries": 0, "num_retries": 0}
    if cfg.base_url:
        call["api_base"] = cfg.base_url
    secret = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    if secret is not None:
        call["api_key"] = secret
    model = BatonLiteLlm(
        model=ref.id,
        inner=LiteLlm(model=ref.id, **call),
        provider=ref.provider,
        key_variable=cfg.key_variable,
        transient_attempts=retry.transient_attempts,
        transient_initial_s=retry.transient_initial_s,
        transient_max_s=retry.transient_max_s,
        governor=governor,
        inline_wait_max_s=retry.inline_wait_max_s,
        on_wait=on_wait,
        stage=stage,
    )
    model._secret = secret
    return model


def unusable(ref: ModelRef, cfg: ProviderConfig) -> str | None:
    """What keeps `ref` from being called with `cfg` (a key or a server not configured), as a
    person should read it; None when nothing does. A vLLM server's key is optional."""
    missing = litellm_missing(ref)
    if missing is not None:
        return missing
    if cfg.key_variable is not None and cfg.api_key is None and ref.provider != "hosted_vllm":
        return missing_key_message(ref, cfg)
    needed = NEEDS_BASE_URL.get(ref.provider)
    if needed is not None and not cfg.base_url:
        return f"{ref.id} needs its server's URL: set {needed}"
    return None


def missing_key_message(ref: ModelRef, cfg: ProviderConfig) -> str:
    """What to do when a provider's key is not configured."""
    where = f" (the server at {cfg.base_url} takes any non-empty key)" if cfg.base_url else ""
    return f"no API key for {ref.id}: set {cfg.key_variable} (or {cfg.key_variable}_FILE){where}"


def model_error(
    exc: BaseException, provider: str, key_variable: str | None = None, *, secret: str | None = None
) -> ExecutionError | None:
    """A LiteLLM call's failure as Baton's error (a 429 with the delay its headers ask for, a
    5xx or a dropped connection transient, another 4xx final); None if `exc` is not a model
    call's failure. No message holds the provider's words about a key, nor `secret`."""
    status = _status_of(exc)
    if status is None:
        if isinstance(exc, _TRANSIENT_HTTP):
            return ModelUnavailableError(f"{provider} unreachable after retries: {_kind(exc)}")
        return None
    said = _short(_redacted(_provider_message(exc), secret))
    if status == 429:
        return RateLimitedError(f"model rate limit ({provider} 429): {said}", retry_delay_s(exc))
    if status >= 500 or status == 408:
        return ModelUnavailableError(
            f"model unavailable after retries ({provider} {status}): {said}"
        )
    if status in (401, 403):
        check = f"; check {key_variable}" if key_variable else ""
        return ModelRejectedError(f"the {provider} API refused the key ({status}){check}")
    return ModelRejectedError(
        f"the {provider} API refused the request ({status}: {said}); check the stage's model "
        "and the request"
    )


def retry_delay_s(exc: BaseException) -> float | None:
    """The delay a 429 asks for, from the provider's response headers as LiteLLM keeps them
    (`response.headers`, else `litellm_response_headers`)."""
    response = getattr(exc, "response", None)
    headers: Mapping[str, str] = getattr(response, "headers", None) or {}
    delay = delay_s(headers)
    if delay is None:
        kept = getattr(exc, "litellm_response_headers", None)
        delay = delay_s(kept) if isinstance(kept, Mapping) else None
    return delay


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a LiteLLM error (they are the OpenAI client's errors); 503 for a
    connection that failed, None for anything else."""
    import openai  # LiteLLM's own dependency, loaded with it

    if not isinstance(exc, openai.APIError):
        return None
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    return 503 if isinstance(exc, openai.APIConnectionError) else None


def _provider_message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def _redacted(text: str, secret: str | None) -> str:
    return text.replace(secret, "[key]") if secret else text


def _kind(exc: BaseException) -> str:
    return type(exc).__name__


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _as_gemini_usage(response: LlmResponse) -> LlmResponse:
    """The response with its token counts meaning what Gemini's do. ADK puts LiteLLM's
    `completion_tokens` in `candidates_token_count` and its reasoning tokens in
    `thoughts_token_count`, but OpenAI-style completion tokens include the reasoning ones,
    while Gemini's candidates do not: counted as they come, a stage's output tokens would hold
    the reasoning twice."""
    usage = response.usage_metadata
    if usage is None or not usage.thoughts_token_count:
        return response
    answer = max(0, (usage.candidates_token_count or 0) - usage.thoughts_token_count)
    response.usage_metadata = usage.model_copy(update={"candidates_token_count": answer})
    return response

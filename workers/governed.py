"""A model whose every retry decision is Baton's, whichever provider serves it.

The providers' own clients are told not to retry (they ignore the server's delay). Instead,
for Gemini (`workers.gemini`) and LiteLLM's providers (`workers.lite_llm`) alike:

* Before every attempt, the fleet's `Governor` (optional) waits for the model's quota and any
  cooldown; after a reply it learns the real token count.
* 429 → the whole fleet cools down for the server's delay (`Governor.cooldown`), whatever the
  provider called it (Gemini's `RetryInfo`, `Retry-After`, `x-ratelimit-reset-*`, Anthropic's
  resets: `workers.ratelimits`). A stage that has made progress (a call already answered)
  waits a short delay out inside the call and sends it again, a few times at most; otherwise
  → `RateLimitedError(delay_s)`, and the Celery task puts the stage back on its queue with a
  countdown of that delay (`rate_limit_countdown`).
* 5xx, timeouts and dropped connections (`ModelUnavailableError`) → retried here with tenacity
  (exponential backoff with jitter, bounded), but only before the first chunk of a reply
  arrived.
* 400/401/403/404 → `ModelRejectedError`, at once.
* With a run budget (`spending`), every attempt is reserved from the run's shared spend before
  it goes out and reconciled with the reply's usage after (`workers.spending`); a refused one
  raises `RunBudgetExceededError` before anything is sent.

A subclass says how its provider's failures read as Baton's errors (`failure`), how it sends
one request (`send`), and what it raises when it gives up (`given_up`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from pydantic import Field, PrivateAttr, SkipValidation
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from orchestrator.core.fanin import BranchRecord
from orchestrator.core.models import StageRecord
from orchestrator.core.settings import RetryConfig
from workers import metrics
from workers.budget import request_tokens
from workers.errors import ExecutionError, ModelUnavailableError, RateLimitedError
from workers.governor import JITTER_S, REASONS, Governor, Permit, WaitCallback
from workers.spending import RunSpending
from workers.timings import MODEL, timed_iteration

logger = logging.getLogger(__name__)

RATE_LIMIT_BACKOFF_CAP_S = 120.0
COOLDOWN_FALLBACK_S = 5.0
"""The fleet's cooldown after a 429 that names no delay."""
MAX_INLINE_429S = 3
"""429s one stage waits out inside its model calls before it goes back on its queue."""


class GovernedLlm(BaseLlm):
    """A model whose calls wait for the fleet's quota, whose transient failures are retried
    with bounded, jittered backoff and whose 429s cool the fleet down. One instance serves one
    stage execution."""

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
    spending: SkipValidation[RunSpending | None] = Field(default=None, exclude=True)
    """The run's budget, which every attempt is reserved from before it is sent
    (`workers.spending`); None: no run budget."""
    _waited_s: float = PrivateAttr(0.0)
    _answered: int = PrivateAttr(0)
    _inline_429s: int = PrivateAttr(0)

    @property
    def waited_s(self) -> float:
        """Time this model's calls have slept for quota, cooldowns and 429s so far."""
        return round(self._waited_s, 3)

    def failure(self, exc: BaseException) -> ExecutionError | None:
        """`exc` as Baton's error if it is this provider's failure of a call (a 429 is a
        `RateLimitedError` with the server's delay), else None."""
        raise NotImplementedError

    def send(self, llm_request: LlmRequest, stream: bool) -> AsyncGenerator[LlmResponse, None]:
        """One request to the provider, no retries, no waiting: its replies."""
        raise NotImplementedError

    def given_up(self, exc: BaseException, failure: ExecutionError | None) -> BaseException:
        """What a call raises when it gives up on `exc` (classified as `failure`)."""
        return exc

    def describe(self, exc: BaseException) -> str:
        """`exc` in a log line: what failed, never a key or a prompt."""
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__

    def prepare(self) -> None:
        """Called right before a permit is asked for: whatever makes the request go out soon
        after it (the provider's client) is made first."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        while True:
            yielded = False
            try:
                async for response in self._call_with_retries(llm_request, stream):
                    yielded = True
                    yield response
            except Exception as exc:
                failure = self.failure(exc)
                if isinstance(failure, RateLimitedError):
                    metrics.rate_limited(self.model)
                    if not yielded and await self._wait_out_429(failure):
                        continue
                raised = self.given_up(exc, failure)
                if raised is exc:
                    raise
                raise raised from exc
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
            return not started and isinstance(self.failure(exc), ModelUnavailableError)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.transient_attempts),
            wait=wait_exponential_jitter(
                initial=self.transient_initial_s,
                max=self.transient_max_s,
                jitter=self.transient_initial_s,
            ),
            retry=retry_if_exception(retryable),
            before_sleep=self._log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                spending, reserved, sent = self.spending, None, False
                if spending is not None:
                    reserved = spending.reserve(self.model, request_tokens(llm_request))
                final: LlmResponse | None = None
                try:
                    permit = await self._acquire(llm_request)
                    metrics.model_call(self.model, self.stage)
                    sent = True
                    replies = timed_iteration(MODEL, self.send(llm_request, stream))
                    async for response in replies:
                        started = True
                        if response.usage_metadata is not None and not response.partial:
                            final = response
                        yield response
                finally:
                    prompt, output = reply_usage(final)
                    if spending is not None and reserved is not None:
                        spending.reconcile(self.model, reserved, prompt, output, sent=sent)
                if final is not None and final.usage_metadata is not None:
                    metrics.tokens_used(self.model, self.stage, prompt=prompt, output=output)
                if self.governor is not None and permit is not None and final is not None:
                    self.governor.reconcile(permit, reply_tokens(final))

    async def _acquire(self, llm_request: LlmRequest) -> Permit | None:
        """Wait for the fleet's quota and any cooldown (None without a governor)."""
        if self.governor is None:
            return None
        # The provider's client is made first, so that the permit is taken as close as
        # possible to the request going out (the provider's window counts from its arrival).
        self.prepare()
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

    async def _wait_out_429(self, limited: RateLimitedError) -> bool:
        """Cool the fleet down; True when this stage waits inside the call and sends it again
        (the next permit sleeps out the cooldown), False when the 429 should go to Celery."""
        cooldown_s = COOLDOWN_FALLBACK_S if limited.delay_s is None else limited.delay_s
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

    def _log_retry(self, state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        logger.warning(
            "model call failed transiently (%s); attempt %d, retrying",
            self.describe(exc) if exc is not None else "unknown error",
            state.attempt_number,
        )


def reply_usage(response: LlmResponse | None) -> tuple[int, int]:
    """A reply's prompt tokens and output tokens (its thoughts included); none without one."""
    usage = response.usage_metadata if response is not None else None
    if usage is None:
        return 0, 0
    output = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
    return usage.prompt_token_count or 0, output


def reply_tokens(response: LlmResponse) -> int:
    """What a reply counts against a tokens-per-minute quota: its total (prompt, reply and
    thoughts), else the sum of the parts it gives."""
    usage = response.usage_metadata
    if usage is None:
        return 0
    if usage.total_token_count:
        return usage.total_token_count
    parts = (usage.prompt_token_count, usage.candidates_token_count, usage.thoughts_token_count)
    return sum(count or 0 for count in parts)


def rate_limit_countdown(
    exc: RateLimitedError, record: StageRecord | BranchRecord, cfg: RetryConfig
) -> float | None:
    """Seconds until the next attempt: the server's delay (or backoff) plus positive jitter.

    None when the stage (or the branch: `record` is its own) has used up its retries or its
    total wait.
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

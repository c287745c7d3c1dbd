"""Errors that end an execution of a stage, each with its own handling.

    BatonError (orchestrator.core.errors)
    └── ExecutionError          (RuntimeError)
        ├── RateLimitedError                      a 429: back on the queue after `delay_s`
        │   └── QuotaWaitError                    the fleet's quota would keep a call waiting
        ├── InfrastructureError                   Docker (or the like) failed mid-stage
        ├── StageCancelledError                   the run was cancelled; the stage stopped
        ├── LeaseLostError                        another execution holds the stage now
        └── StageError                            the stage fails and the run ends
            ├── ModelRejectedError                400/401/403: retrying will not help
            ├── ModelUnavailableError             5xx, timeouts, dropped connections
            ├── ModelCallLimitError               the model-call budget ran out
            ├── RunBudgetExceededError            the run's budget refused a model call
            ├── StageOutputError  (ValueError)    the output failed its schema
            ├── TestsFailedError                  the tests still fail after the change
            │   └── ProofFailedError              Baton's proof of the change failed
            ├── NotReproducedError                the reproducing tests do not fail as said
            ├── PublishError                      the fix could not be pushed
            ├── StageTimeLimitError (TimeoutError) the soft time limit passed
            ├── InterruptedTooOftenError          its workers were lost too often
            ├── UnrunnableStageError              this worker cannot load the run's pipeline
            └── InternalError                     anything Baton did not expect

Each class says how the stage task handles it (`retry`, a `Retry`) and why a metric counts it
(`reason`, a `Reason`); the task, the model client and the metrics read both from the error
instead of classifying it each in its own way. Anything else that ends an execution is turned
into one of these once, where it is caught (`workers.tasks`, `workers.gemini.model_error`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal, get_args

from orchestrator.core.errors import BatonError

Reason = Literal[
    "rate_limited", "infrastructure", "cancelled", "lost", "stage_error", "model_rejected",
    "model_unavailable", "model_call_limit", "output_invalid", "tests_failed", "proof_failed",
    "not_reproduced", "publish_failed", "time_limit", "internal", "budget_exceeded",
]  # fmt: skip
"""Why an execution ended without its output: the `reason` label of
`baton_stage_failures_total`."""
FAILURE_REASONS: tuple[Reason, ...] = get_args(Reason)


class Retry(StrEnum):
    """What the stage task does when an execution ends with an error."""

    NONE = "none"
    """Nothing: the stage fails and the run ends, the message its reason (or, for a
    cancellation, the stage is recorded as stopped)."""
    RATE_LIMITED = "rate_limited"
    """Back on its queue after the error's `delay_s` (else a backoff), within the stage's
    rate-limit budget; the stage shows `waiting` meanwhile."""
    INFRASTRUCTURE = "infrastructure"
    """Back on its queue after a short backoff, a bounded number of times."""
    LOST = "lost"
    """Nothing is recorded: another execution holds the stage now and decides."""


class ExecutionError(BatonError, RuntimeError):
    """Raised when an execution of a stage ends without its output; see the module docstring
    for what each subclass means and how it is handled."""

    retry: ClassVar[Retry] = Retry.NONE
    reason: ClassVar[Reason] = "stage_error"
    ends_run: ClassVar[bool] = False
    """The failure is the run's, not the execution's: an execution of one branch of a fan-out
    that fails with it ends the whole run (`orchestrator.core.fanstop.fail_from_branch`), where
    any other failure ends only its branch."""


class RateLimitedError(ExecutionError):
    """Raised when the model API answers 429; `delay_s` is the server's `retryDelay`, if any."""

    retry = Retry.RATE_LIMITED
    reason = "rate_limited"

    def __init__(self, message: str, delay_s: float | None = None) -> None:
        super().__init__(message, delay_s)
        self.delay_s = delay_s


class QuotaWaitError(RateLimitedError):
    """Raised when the fleet's quota or a 429 cooldown would keep a model call waiting longer
    than a stage may sleep; `delay_s` is that wait, the countdown of the stage's retry."""


class InfrastructureError(ExecutionError):
    """Raised when something outside the stage failed mid-stage (the Docker daemon, say); the
    stage is tried again from the start, a bounded number of times."""

    retry = Retry.INFRASTRUCTURE
    reason = "infrastructure"


class StageCancelledError(ExecutionError):
    """Raised at a stage's next safe point (a model or tool call, a side effect) once its run
    is cancelled."""

    reason = "cancelled"

    def __init__(self, message: str = "the run was cancelled") -> None:
        super().__init__(message)


class LeaseLostError(ExecutionError):
    """Raised at a safe point when this execution no longer holds its stage (its lease lapsed
    and another execution took the stage over)."""

    retry = Retry.LOST
    reason = "lost"


class StageError(ExecutionError):
    """Raised when a stage cannot produce its output; its message becomes the run's reason."""


class ModelRejectedError(StageError):
    """Raised when the model API refuses a request (400, 401, 403): retrying will not help."""

    reason = "model_rejected"


class ModelUnavailableError(StageError):
    """Raised when 5xx answers, timeouts or dropped connections outlast the bounded backoff of
    one model call (the model client retries what would become this error inside the call)."""

    reason = "model_unavailable"


class ModelCallLimitError(StageError):
    """Raised when a stage reaches its budget of model calls."""

    reason = "model_call_limit"


class RunBudgetExceededError(StageError):
    """Raised when the run's budget refuses a model call (`orchestrator.core.spend`), before
    it is sent: the message names the limit and the figures, and the run fails with it."""

    reason = "budget_exceeded"
    ends_run = True


class StageOutputError(StageError, ValueError):
    """Raised when a stage's output does not match its schema after one repair turn."""

    reason = "output_invalid"


class TestsFailedError(StageError):
    """Raised when a fix's tests still fail after the change, so it is not handed on."""

    __test__ = False  # not a pytest test class
    reason: ClassVar[Reason] = "tests_failed"


class ProofFailedError(TestsFailedError):
    """Raised when Baton's proof of a change fails (and no loop tries again)."""

    reason = "proof_failed"


class NotReproducedError(StageError):
    """Raised when the reproducing tests do not fail on the unchanged code, or fail for another
    reason than the one the stage named; the message says which."""

    reason = "not_reproduced"


class PublishError(StageError):
    """Raised when a fix cannot be published: the diff is empty or does not apply, the push or
    the pull request is refused. The message names the repository, the branch and the step."""

    reason = "publish_failed"


class StageTimeLimitError(StageError, TimeoutError):
    """Raised when a stage runs past its soft time limit."""

    reason = "time_limit"


class InterruptedTooOftenError(StageError):
    """Raised when the executions of a stage were lost (their workers died) too often."""

    reason = "lost"


class UnrunnableStageError(StageError):
    """Raised when a worker cannot run a delivered stage: the pipeline its run pinned is missing
    or invalid, names no such stage, or imports a schema this worker does not have. The run
    fails with that reason rather than wait on its queue for a worker that could."""


class InternalError(StageError):
    """Raised in place of an exception Baton did not expect; the message names its type."""

    reason = "internal"

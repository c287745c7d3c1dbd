"""Errors raised while executing a stage.

    BatonError (orchestrator.errors)
    ├── RateLimitedError         (RuntimeError)  retryable: the task goes back on its queue
    │   └── QuotaWaitError                       the fleet's quota would keep a call waiting long
    ├── InfrastructureError      (RuntimeError)  retryable a few times: Docker or the like failed
    ├── StageCancelledError      (RuntimeError)  the run was cancelled; the stage stopped
    └── StageError               (RuntimeError)  the stage fails and the run ends
        ├── ModelRejectedError                   400/401/403: retrying will not help
        ├── ModelUnavailableError                5xx, timeouts, dropped connections, after backoff
        ├── ModelCallLimitError                  the stage's model-call budget ran out
        ├── PublishError                         the fix could not be pushed or its PR opened
        └── StageOutputError     (ValueError)    the output failed its schema after one repair turn

Every class passes all of its arguments to ``super().__init__`` so that it pickles.
"""

from __future__ import annotations

from orchestrator.errors import BatonError


class RateLimitedError(BatonError, RuntimeError):
    """Raised when the model API answers 429; `delay_s` is the server's `retryDelay`, if any."""

    def __init__(self, message: str, delay_s: float | None = None) -> None:
        super().__init__(message, delay_s)
        self.message = message
        self.delay_s = delay_s

    def __str__(self) -> str:
        return self.message


class QuotaWaitError(RateLimitedError):
    """Raised when the fleet's quota or a 429 cooldown would keep a model call waiting longer
    than a stage may sleep; `delay_s` is that wait, and the stage goes back on its queue with
    that countdown (a `RateLimitedError`, so the Celery task already does this)."""


class InfrastructureError(BatonError, RuntimeError):
    """Raised when something outside the stage failed mid-stage (the Docker daemon, say); the
    stage is tried again from the start, a bounded number of times."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StageCancelledError(BatonError, RuntimeError):
    """Raised at a stage's next safe point (a model or tool call) once its run is cancelled."""

    def __init__(self, message: str = "the run was cancelled") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StageError(BatonError, RuntimeError):
    """Raised when a stage cannot produce its output; its message becomes the run's reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ModelRejectedError(StageError):
    """Raised when the model API refuses a request (400, 401, 403): retrying will not help."""


class ModelUnavailableError(StageError):
    """Raised when 5xx errors, timeouts or dropped connections outlast the bounded backoff."""


class ModelCallLimitError(StageError):
    """Raised when a stage reaches its budget of model calls."""


class StageOutputError(StageError, ValueError):
    """Raised when a stage's output does not match its schema after one repair turn."""


class TestsFailedError(StageError):
    """Raised when a fix's tests still fail after the change, so it is not handed on."""


class PublishError(StageError):
    """Raised when a fix cannot be published: the diff is empty or does not apply, the push or
    the pull request is refused. The message names the repository, the branch and the step."""

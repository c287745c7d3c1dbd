"""Errors raised by the orchestrator.

    BatonError
    ├── ConfigError          (ValueError)
    ├── IntakeError          (ValueError)
    │   └── PayloadTooLargeError
    ├── PipelineError        (ValueError)
    ├── RepoError            (RuntimeError)
    ├── RunNotFoundError     (KeyError)
    └── RunStateError        (ValueError)

Every class passes all of its arguments to ``super().__init__`` so that it survives pickling
(Celery moves exceptions between processes).
"""

from __future__ import annotations


class BatonError(Exception):
    """Root of every error Baton raises on purpose."""


class ConfigError(BatonError, ValueError):
    """Raised when configuration is missing or inconsistent."""


class IntakeError(BatonError, ValueError):
    """Raised when a payload cannot become an `Issue`; the message names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, field)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class PayloadTooLargeError(IntakeError):
    """Raised when a payload exceeds the intake size cap."""


class PipelineError(BatonError, ValueError):
    """Raised when a pipeline is unknown or its spec is invalid."""


class RepoError(BatonError, RuntimeError):
    """Raised when a repository cannot be resolved or checked out."""


class RunNotFoundError(BatonError, KeyError):
    """Raised when a run id names no run in the store."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"no run with id {self.run_id!r}"


class RunStateError(BatonError, ValueError):
    """Raised when a run is not in a state that allows the operation (resuming a run that is
    still going, say)."""

"""Errors raised by the orchestrator, and the root of every error Baton raises on purpose.

    BatonError
    ├── ConfigError          (ValueError)
    ├── IntakeError          (ValueError)
    │   ├── PayloadTooLargeError
    │   └── NotJsonError
    ├── PipelineError        (ValueError)
    ├── RepoError            (RuntimeError)
    ├── RunNotFoundError     (KeyError)
    ├── ArtifactNotFoundError (KeyError)
    └── RunStateError        (ValueError)

`BatonError` holds the message formatting every subclass shares: the first argument is the
message a person reads, the rest are details the subclass keeps. All of them reach
``Exception.__init__``, so that every subclass survives pickling (Celery moves exceptions
between processes); a test pickles every subclass it can find.
"""

from __future__ import annotations

from typing import Any


class BatonError(Exception):
    """Root of every error Baton raises on purpose. `str()` is its message."""

    def __init__(self, message: str, *details: Any) -> None:
        super().__init__(message, *details)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(BatonError, ValueError):
    """Raised when configuration is missing or inconsistent."""


class IntakeError(BatonError, ValueError):
    """Raised when a payload cannot become an `Issue`; the message names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, field)
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class PayloadTooLargeError(IntakeError):
    """Raised when a payload exceeds the intake size cap."""


class NotJsonError(IntakeError):
    """Raised when a payload file (or anything else that must be JSON) holds plain text."""


class PipelineError(BatonError, ValueError):
    """Raised when a pipeline is unknown or its spec is invalid."""


class EnvironmentFileError(BatonError, ValueError):
    """Raised when an environment spec given at enqueue (`--env FILE`) is not valid; the
    message names the file and what is wrong."""


class RepoError(BatonError, RuntimeError):
    """Raised when a repository cannot be resolved or checked out."""


class RunNotFoundError(BatonError, KeyError):
    """Raised when a run id names no run in the store."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}")
        self.args = (run_id,)  # what __init__ takes, for pickling
        self.run_id = run_id


class ArtifactNotFoundError(BatonError, KeyError):
    """Raised when a run has no artifact (or output) of the name asked for, or it has expired;
    the message lists what the run does have."""


class RunStateError(BatonError, ValueError):
    """Raised when a run is not in a state that allows the operation (resuming a run that is
    still going, say)."""

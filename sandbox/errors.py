"""Errors raised by sandboxes.

    SandboxError
    ├── SandboxStartError        (RuntimeError)     no container could be started; not retryable
    ├── SandboxUnavailableError  (ConnectionError)  the daemon failed or the container was lost
    │                                               mid-stage; retryable
    ├── SandboxFileError         (OSError)          a file operation failed inside the sandbox
    ├── EnvironmentSpecError     (ValueError)       a repository's environment spec is not valid
    ├── ClientHelloError         (ValueError)       a tunnel's first bytes are no ClientHello the
    │                                               egress proxy accepts (sandbox.clienthello)
    ├── EnvironmentBuildError    (RuntimeError)     a setup command failed (sandbox.build)
    └── EnvironmentValidationError (RuntimeError)   its tests cannot start there (sandbox.build)

A command that fails, times out or is killed for memory is not an error: `DockerSandbox.exec`
reports it in its `ExecResult`. Every class passes all of its arguments to
``super().__init__`` so that it survives pickling (Celery moves exceptions between processes).
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every error a sandbox raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SandboxStartError(SandboxError, RuntimeError):
    """Raised when no container can be created or started: the image is missing, the named
    network does not exist, the daemon refused the configuration. The message says what to do;
    retrying the same thing will not help."""


class SandboxUnavailableError(SandboxError, ConnectionError):
    """Raised when the Docker daemon cannot be reached or answers with an error, or when the
    sandbox's container disappeared under a running stage (a daemon restart, its `ttl_s`
    passed). Callers treat it as retryable: start the stage again in a new sandbox."""


class SandboxFileError(SandboxError, OSError):
    """Raised when a file cannot be read from or written into a sandbox: the path does not
    exist, is not a regular file, is not writable by the sandbox's user, or is bigger than the
    caller allows."""


class EnvironmentSpecError(SandboxError, ValueError):
    """Raised when a repository's environment spec cannot be used: its `.baton/environment.toml`
    (or `--env FILE`) is not TOML or not a valid spec, a manifest it was detected from does not
    parse, or a dependency file is too large to key. The message names the file and the fault;
    retrying will not help."""


class ClientHelloError(SandboxError, ValueError):
    """Raised when the first bytes a build sends through an egress tunnel are not a well-formed
    TLS ClientHello within the parser's bounds (`sandbox.clienthello`). The proxy closes that
    tunnel and logs the message, which names the fault."""

"""What a worker process reads from the environment: Baton's `Settings` plus the sandbox and the
publishing credentials, which only workers need."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr

from orchestrator.core.settings import Settings
from sandbox import SandboxConfig
from sandbox.build import BuildSettings
from workers.github import GITHUB_API_URL


class WorkerSettings(Settings):
    """`Settings` plus `BATON_SANDBOX__*`, `BATON_GITHUB_TOKEN` and `BATON_GITHUB_API_URL`."""

    sandbox: SandboxConfig = SandboxConfig()
    """Limits of every code stage's container (`BATON_SANDBOX__MEMORY_MB=2048`, …)."""
    sandbox_pool_size: int = Field(1, ge=0, le=16)
    """`BATON_SANDBOX_POOL_SIZE`: started, idle sandboxes each worker process keeps ready for
    each environment it used lately (`sandbox.pool`), so that a stage does not wait for one to
    start; 0 starts each one when a stage asks. A taken one is named for its execution, not
    labelled: `docker ps --filter name=<run>` finds a run's sandboxes either way."""
    keep_model_requests: bool = False
    """`BATON_KEEP_MODEL_REQUESTS`: keep every model request of a stage, as sent, as its artifact
    `model-requests.jsonl` (the replies are always in the audit log; `baton replay` needs only
    those). Requests hold the prompts — issue text and code — and can be large."""
    build: BuildSettings = BuildSettings()
    """How environments are built (`BATON_BUILD__INDEX_URL`, `BATON_BUILD__CA_BUNDLE`, …):
    build-time registry settings, never given to a stage's sandbox."""
    github_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("BATON_GITHUB_TOKEN", "GITHUB_TOKEN")
    )
    """Opens pull requests on GitHub remotes; used on the worker host only, never in a sandbox,
    a prompt, a log line or an artifact."""
    github_api_url: str = GITHUB_API_URL
    """`BATON_GITHUB_API_URL`, for GitHub Enterprise (github.com's API unless set)."""
    health_file: Path | None = None
    """`BATON_HEALTH_FILE`: touched when the worker is ready and at every heartbeat of its
    consumer (2 s) while its housekeeping thread lives, for liveness and readiness probes:
    older than a minute means the worker no longer takes tasks."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """`BATON_METRICS_PORT`: the worker's main process serves Prometheus `/metrics` on this
    port (9808 by convention), summed over its pool processes; unset, no metrics are served."""
    metrics_dir: Path | None = None
    """`BATON_METRICS_DIR`: where pool processes write their samples, emptied when the worker
    starts; one directory per worker. Unset: a fresh temporary directory, removed at exit."""

    def build_settings(self) -> BuildSettings:
        """The build settings, from the sandbox image that `BATON_SANDBOX_IMAGE` names, under
        the sandboxes' runtime unless `BATON_BUILD__RUNTIME` names another."""
        update: dict[str, object] = {}
        if self.sandbox_image:
            update["base_image"] = self.sandbox_image
        if self.build.runtime is None and self.sandbox.runtime is not None:
            update["runtime"] = self.sandbox.runtime
        return self.build.model_copy(update=update) if update else self.build

    def sandbox_config(self) -> SandboxConfig:
        """The sandbox limits, with `BATON_SANDBOX_IMAGE` as the image when it is set."""
        if self.sandbox_image:
            return self.sandbox.model_copy(update={"image": self.sandbox_image})
        return self.sandbox

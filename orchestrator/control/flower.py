"""`baton flower`: Flower watching Baton's broker, set up so a person can follow a run.

Every Flower option Baton sets lives here. Flower loads `orchestrator.control.flower_app`, a Celery
app with Baton's broker settings (TLS included) and nothing else, never `-A workers.app`, so it
does not import Baton's workers and their dependencies (shared/notes/celery-flower.md §4). It
builds its view from Celery events: Baton's workers send them (`-E`) and so does the sending
side (`task_send_sent_event`), but a task sent before Flower started stays invisible.

Secrets stay off the command line, where `ps` would show them: the broker URL (it may hold a
Redis password) reaches Flower's app as `BATON_REDIS_URL` (or `_FILE`), read by Baton's
settings there, and the basic-auth login as `FLOWER_BASIC_AUTH`, in its environment.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, SecretStr
from pydantic_settings import SettingsConfigDict

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import BatonSettings, refuse_placeholders

APP = "orchestrator.control.flower_app"
"""The Celery app Flower loads: Baton's broker settings, no tasks."""
MAX_TASKS = 10_000
"""Tasks Flower keeps in memory (its own default, 100,000, grows without need: five per run)."""
PURGE_OFFLINE_WORKERS_S = 300
"""Seconds after which an offline worker leaves Flower's views and metrics (names churn as
workers restart, each with the pid in its name)."""
TASKS_COLUMNS = ("name", "uuid", "state", "received", "runtime", "worker")
"""Columns of the Tasks page, chosen to fit a 1400-pixel window. A stage task's name is its
stage's (`baton.fix`: the dispatcher sends it as a shadow name of `baton.run_stage`) and its id
is `<run_id>.<stage>`, so name and id say which run and stage; a branch of a fan-out stage is
`baton.<pipeline>.<stage>.<branch>` with id `<run_id>.<stage>.<branch>`
(`orchestrator.core.branches`; the run page links to each). Flower's default `args` would only
repeat them. Left out too: `retries` (the "Retried" filter still lists stages waiting out a
429). Times stay absolute, without `natural_time`: "a minute ago" for all five stages of a
run would hide their order."""


class FlowerCredentials(BatonSettings):
    """`BATON_FLOWER_USER` and `BATON_FLOWER_PASSWORD`: the one login of Flower's basic auth."""

    model_config = SettingsConfigDict(env_prefix="BATON_FLOWER_", extra="ignore", frozen=True)

    user: str | None = None
    """`BATON_FLOWER_USER`."""
    password: SecretStr | None = None
    """`BATON_FLOWER_PASSWORD`; never logged, never on a command line."""


class FlowerConfig(BaseModel):
    """How to start Flower; `credentials` None serves it without a login."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int
    address: str
    credentials: FlowerCredentials | None
    """Basic-auth login; required unless the user asked for none (`--no-auth`)."""


def flower_config(
    credentials: FlowerCredentials, *, port: int, address: str, auth: bool
) -> FlowerConfig:
    """Checks the login before anything starts.

    Raises:
        ConfigError: when auth is on and the user or password is missing, or unusable.
    """
    if not auth:
        return FlowerConfig(port=port, address=address, credentials=None)
    password = credentials.password.get_secret_value() if credentials.password else ""
    if not credentials.user or not password:
        raise ConfigError(
            "BATON_FLOWER_USER and BATON_FLOWER_PASSWORD must both be set for Flower's login; "
            "set them, or pass --no-auth to serve Flower to anyone who can reach it"
        )
    refuse_placeholders({"BATON_FLOWER_PASSWORD": password})
    if ":" in credentials.user or "," in credentials.user + password:
        # Flower splits its list of logins on commas, and a login on the first colon.
        raise ConfigError(
            "BATON_FLOWER_USER must not contain ':' or ',' and BATON_FLOWER_PASSWORD must "
            "not contain ','; choose others"
        )
    return FlowerConfig(port=port, address=address, credentials=credentials)


def flower_argv(config: FlowerConfig) -> list[str]:
    """The command line: no secret in it (see `flower_env`)."""
    return [
        sys.executable, "-m", "celery", "-A", APP, "flower",
        f"--port={config.port}",
        f"--address={config.address}",
        f"--max_tasks={MAX_TASKS}",
        f"--purge_offline_workers={PURGE_OFFLINE_WORKERS_S}",
        f"--tasks_columns={','.join(TASKS_COLUMNS)}",
        # Revoking or terminating a stage in Flower would bypass `baton cancel`: the run would
        # stay queued and the reconciler would send the stage again. Control is Baton's.
        "--read_only=true",
    ]  # fmt: skip


def flower_env(config: FlowerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """Flower's environment: `environ` (where its app finds `BATON_REDIS_*`) with the login
    added, and without `CELERY_BROKER_URL`, which Celery would prefer to Baton's checked URL."""
    env = {name: value for name, value in environ.items() if name != "CELERY_BROKER_URL"}
    if config.credentials is not None:
        assert config.credentials.user and config.credentials.password  # flower_config checked
        login = f"{config.credentials.user}:{config.credentials.password.get_secret_value()}"
        env["FLOWER_BASIC_AUTH"] = login
    return env

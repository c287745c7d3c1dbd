"""`baton worker`, added to the `baton` command by entry point: a Celery worker (prefork) on
the queues of the stages of one pipeline it serves (`baton.<pipeline>.<stage>`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

import click

from orchestrator.core.errors import ConfigError
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.providers import parse_model
from orchestrator.core.queue import check_time_limits
from orchestrator.core.settings import Settings
from workers import lite_llm
from workers.gemini import missing_key_message

APP = "workers.app"
"""The Celery app a worker process loads."""


def worker_argv(
    queues: Sequence[str], *, concurrency: int, name: str, loglevel: str = "INFO", app: str = APP
) -> list[str]:
    """The command line of a Baton worker: Celery, prefork, task events on, these queues."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker",
        "-Q", ",".join(queues), "-c", str(concurrency), "-P", "prefork", "-E",
        "--loglevel", loglevel, "-n", f"{name}@%h",
    ]  # fmt: skip


@click.command()
@click.option("--stages", default="all", show_default=True, help="Comma-separated stages to serve.")
@click.option("--pipeline", default="fixer", show_default=True,
              help="The pipeline whose stages to serve: an installed pipeline's name or a TOML "
              "file. Its schemas must import here.")  # fmt: skip
@click.option("--concurrency", "-c", default=1, show_default=True, help="Worker processes.")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--builder", is_flag=True,
              help="Serve no stage: build the environments the code-stage workers of this "
              "Docker daemon hand over (DOCKER_HOST: the gate's build socket).")  # fmt: skip
def worker(stages: str, pipeline: str, concurrency: int, loglevel: str, builder: bool) -> None:
    """Run a Celery worker that serves the queues of the given stages of a pipeline. It runs any
    run's stage delivered to them with the pipeline version that run pinned."""
    if builder:
        _builder(concurrency, loglevel)
    spec = load_pipeline(pipeline)
    names = (
        [s.name for s in spec.stages] if stages == "all" else [s.strip() for s in stages.split(",")]
    )
    queues = [spec.stage(name).queue for name in names]  # an unknown stage is refused here
    settings = Settings()
    settings.require_redis_url()
    _require_model_settings(settings, {spec.model_of(spec.stage(n), settings.model) for n in names})
    check_time_limits(spec, settings.queue, settings.retry)
    _check_concurrency(settings, concurrency)
    label = "-".join(names) if stages != "all" else "all"
    argv = worker_argv(
        queues,
        concurrency=concurrency,
        name=f"baton-{spec.name}-{label}-{os.getpid()}",
        loglevel=loglevel,
    )
    os.execv(sys.executable, argv)


def _builder(concurrency: int, loglevel: str) -> NoReturn:
    """Become the environment builder of the Docker daemon `DOCKER_HOST` reaches."""
    from sandbox.client import connect
    from workers.builder import build_queue

    settings = Settings()
    settings.require_redis_url()
    _check_concurrency(settings, concurrency)
    client = connect()
    try:
        queue = build_queue(client)
    finally:
        client.close()
    argv = worker_argv([queue], concurrency=concurrency, name=f"baton-builder-{os.getpid()}",
                       loglevel=loglevel)  # fmt: skip
    os.execv(sys.executable, argv)


def _check_concurrency(settings: Settings, concurrency: int) -> None:
    if concurrency > settings.queue.eta_task_limit:
        raise ConfigError(
            f"--concurrency {concurrency} is above BATON_QUEUE__ETA_TASK_LIMIT "
            f"({settings.queue.eta_task_limit}), the most messages a worker may hold: raise "
            "the limit to at least the concurrency, or run fewer processes"
        )


def _require_model_settings(settings: Settings, model_ids: Iterable[str]) -> None:
    """Each model the served stages run on has its key (and, for a vLLM server, its URL).

    Raises:
        ConfigError: naming the first setting missing.
    """
    for model_id in sorted(model_ids):
        ref = parse_model(model_id)
        if ref.via_litellm:
            problem = lite_llm.unusable(ref, settings.provider_section(ref.provider))
            if problem is not None:
                raise ConfigError(problem)
        elif settings.google_api_key is None:
            raise ConfigError(missing_key_message(settings.model_section()))

"""Baton from Python: enqueue an issue against a repository, read a run back.

from orchestrator import enqueue
run_id = enqueue(sentry_event_json, repo="/srv/git/shop")
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from orchestrator import repo as repos
from orchestrator.conductor import Conductor
from orchestrator.intake import parse_payload
from orchestrator.models import IssueSource, RunRecord
from orchestrator.pipeline import load_pipeline
from orchestrator.queue import Dispatcher, check_time_limits
from orchestrator.settings import Settings
from orchestrator.store import RunStore


@contextmanager
def connect(settings: Settings) -> Iterator[Conductor]:
    """A conductor on the configured Redis, closed afterwards."""
    url = settings.require_redis_url()
    store = RunStore.from_url(url, ttl_s=settings.queue.run_ttl_s)
    dispatcher = Dispatcher.connect(url, settings.queue)
    try:
        yield Conductor(store, dispatcher)
    finally:
        dispatcher.close()
        store.redis.close()


def submit(
    payload: bytes | str | Mapping[str, Any],
    *,
    repo: str,
    pipeline: str = "fixer",
    source: IssueSource | str | None = None,
    force: bool = False,
    settings: Settings | None = None,
) -> tuple[str, bool]:
    """Like `enqueue`, and also says whether a new run was created (False: the issue already
    had a run, whose id is returned)."""
    settings = settings or Settings()
    data = json.dumps(payload) if isinstance(payload, Mapping) else payload
    issue = parse_payload(data, IssueSource(source) if source else None)
    check_time_limits(load_pipeline(pipeline), settings.queue, settings.retry)
    repo = repos.repo_source(repo)
    commit = repos.resolve_commit(repo)
    with connect(settings) as conductor:
        return conductor.submit(issue, repo=repo, commit=commit, pipeline=pipeline, force=force)


def enqueue(
    payload: bytes | str | Mapping[str, Any],
    *,
    repo: str,
    pipeline: str = "fixer",
    source: IssueSource | str | None = None,
    force: bool = False,
    settings: Settings | None = None,
) -> str:
    """Parse `payload` (Sentry event or issue, GitHub issue, or text), pin the repository's
    current commit, create a run and enqueue its first stage. Returns the run id.

    Nothing is written when the payload, the pipeline or the repository is invalid.

    Raises:
        IntakeError: the payload is malformed; the message names the field.
        PipelineError: the pipeline is unknown or invalid.
        RepoError: the repository cannot be read.
        ConfigError: BATON_REDIS_URL is not set.
    """
    run_id, _ = submit(
        payload, repo=repo, pipeline=pipeline, source=source, force=force, settings=settings
    )
    return run_id


def get_run(run_id: str, *, settings: Settings | None = None) -> RunRecord:
    """The run record. Raises `RunNotFoundError` for an unknown id."""
    settings = settings or Settings()
    store = RunStore.from_url(settings.require_redis_url())
    try:
        return store.get(run_id)
    finally:
        store.redis.close()

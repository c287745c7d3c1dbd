"""Baton from Python: enqueue an issue against a repository, read a run back.

from orchestrator import enqueue
run_id = enqueue(sentry_event_json, repo="/srv/git/shop")
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from orchestrator import git
from orchestrator.conductor import Conductor
from orchestrator.intake import parse_payload
from orchestrator.models import IssueSource, RunRecord, RunStatus
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
    ref: str = "HEAD",
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
    commit = git.resolve_commit(repo, ref)  # refuses a path that is not a repository's root
    source = git.repo_source(repo)
    with connect(settings) as conductor:
        return conductor.submit(issue, repo=source, commit=commit, pipeline=pipeline, force=force)


def enqueue(
    payload: bytes | str | Mapping[str, Any],
    *,
    repo: str,
    ref: str = "HEAD",
    pipeline: str = "fixer",
    source: IssueSource | str | None = None,
    force: bool = False,
    settings: Settings | None = None,
) -> str:
    """Parse `payload` (Sentry event or issue, GitHub issue, or text), pin the commit `ref`
    names in the repository (a branch, a tag or a sha; its HEAD by default), create a run and
    enqueue its first stage. Returns the run id.

    Nothing is written when the payload, the pipeline or the repository is invalid.

    Raises:
        IntakeError: the payload is malformed; the message names the field.
        PipelineError: the pipeline is unknown or invalid.
        RepoError: the repository cannot be read, or a local path is not the root of a git
            repository (a folder inside one, a plain folder, a path that does not exist); the
            message names the path first.
        ConfigError: BATON_REDIS_URL is not set.
    """
    run_id, _ = submit(
        payload, repo=repo, ref=ref, pipeline=pipeline, source=source, force=force,
        settings=settings,
    )  # fmt: skip
    return run_id


def get_run(run_id: str, *, settings: Settings | None = None) -> RunRecord:
    """The run record. Raises `RunNotFoundError` for an unknown id."""
    with connect(settings or Settings()) as conductor:
        return conductor.store.get(run_id)


def list_runs(
    *,
    status: RunStatus | str | None = None,
    pipeline: str | None = None,
    limit: int = 50,
    settings: Settings | None = None,
) -> list[RunRecord]:
    """The newest runs first, optionally only those with a status or of a pipeline."""
    wanted = RunStatus(status) if status else None
    found = []
    with connect(settings or Settings()) as conductor:
        for _, run in conductor.store.get_each(conductor.store.recent(limit=10_000)):
            if run is None:
                continue  # expired
            if (wanted is None or run.status == wanted) and pipeline in (None, run.pipeline):
                found.append(run)
                if len(found) >= limit:
                    break
    return found


def cancel(run_id: str, *, settings: Settings | None = None) -> bool:
    """Cancel a run: nothing more is enqueued, a running stage stops at its next safe point
    and its sandbox is removed. False if the run had already ended.

    Raises:
        RunNotFoundError: no such run.
    """
    with connect(settings or Settings()) as conductor:
        return conductor.cancel(run_id, "cancelled by request")


def resume(run_id: str, *, from_stage: str | None = None, settings: Settings | None = None) -> str:
    """Run a failed or cancelled run again from the stage that did not finish (or
    `from_stage`), keeping every output recorded before it. Returns that stage's name.

    Raises:
        RunNotFoundError: no such run.
        RunStateError: the run has not ended, or it has nothing left to run.
        PipelineError: the pipeline has no stage `from_stage`.
    """
    with connect(settings or Settings()) as conductor:
        return conductor.resume(run_id, from_stage)

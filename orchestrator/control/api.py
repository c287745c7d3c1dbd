"""Baton from Python: enqueue an issue against a repository, read a run back.

from orchestrator import enqueue
run_id = enqueue(sentry_event_json, repo="/srv/git/shop")
"""

from __future__ import annotations

import getpass
import json
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.control.checks import CHECKS_GROUP, check_pipeline
from orchestrator.control.intake import DEFAULT_LIMITS, parse_payload
from orchestrator.core import git
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import EnvironmentFileError, IntakeError, NotJsonError
from orchestrator.core.gates import Approval
from orchestrator.core.models import Issue, IssueSource, RunRecord, RunStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.runbudget import RunBudget, check_priced, parse_budget, run_budget
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore


@contextmanager
def connect(settings: Settings) -> Iterator[Conductor]:
    """A conductor on the configured Redis, closed afterwards."""
    redis = settings.redis_section()
    store = RunStore.from_url(redis, ttl_s=settings.queue.run_ttl_s)
    dispatcher = Dispatcher.connect(redis, settings.queue)
    try:
        yield Conductor(store, dispatcher)
    finally:
        dispatcher.close()
        store.redis.close()


def submit(
    payload: Path | bytes | str | Mapping[str, Any],
    *,
    repo: str,
    ref: str | None = None,
    base: str | None = None,
    pipeline: str = "fixer",
    source: IssueSource | str | None = None,
    force: bool = False,
    environment: Mapping[str, Any] | str | Path | None = None,
    settings: Settings | None = None,
    budget: RunBudget | str | None = None,
) -> tuple[str, bool]:
    """Like `enqueue`, and also says whether a new run was created (False: the issue already
    had a run, whose id is returned)."""
    settings = settings or Settings()
    limits = parse_budget(budget) if isinstance(budget, str) else budget
    issue = read_issue(payload, IssueSource(source) if source else None)
    head, base = change_refs(issue, ref, base)
    checked = checked_pipeline(pipeline, settings)
    if checked.reads_change and base is None:
        raise IntakeError(
            f"pipeline {checked.name!r} reviews a change ({{change}}), so a run needs a base to "
            "measure it against: send a pull request (a GitHub pull request, its webhook "
            "payload, or {number, base, head, repository}) or give --base",
            "base",
        )
    check_priced(run_budget(checked, limits), checked, settings.model, settings.prices)
    spec = read_environment(environment) if environment is not None else None
    commit = git.resolve_commit(repo, head)  # refuses a path that is not a repository's root
    pinned_base = git.resolve_commit(repo, base) if base is not None else None
    source = git.repo_source(repo)
    with connect(settings) as conductor:
        return conductor.submit(
            issue, repo=source, commit=commit, pipeline=checked, force=force, environment=spec,
            base=pinned_base, budget=limits,
        )  # fmt: skip


def change_refs(issue: Issue, ref: str | None, base: str | None) -> tuple[str, str | None]:
    """The head to pin (`ref`, else the pull request's head, else `HEAD`) and the base (`base`,
    else the pull request's, else none).

    Raises:
        IntakeError: `ref` or `base` names another commit than the pull request's own.
    """
    change = issue.change
    if change is None:
        return ref or "HEAD", base
    for given, own, name in ((ref, change.head, "ref"), (base, change.base, "base")):
        if given is not None and given != own:
            raise IntakeError(
                f"the pull request's {'head' if name == 'ref' else 'base'} is {own!r}, but "
                f"--{name} says {given!r}; leave --{name} out (the pull request names it)",
                name,
            )
    return change.head, change.base


def read_issue(
    payload: Path | bytes | str | Mapping[str, Any], source: IssueSource | None = None
) -> Issue:
    """The issue `payload` reports: a payload file (a `Path`, which must hold JSON: a file
    named by mistake is refused, never read as a report), its content (JSON, or plain text),
    or a JSON object already read.

    Raises:
        IntakeError: the file cannot be read (the message names it) or the payload is not valid.
    """
    if isinstance(payload, Mapping):
        return parse_payload(json.dumps(payload), source)
    if not isinstance(payload, Path):
        return parse_payload(payload, source)
    limit = DEFAULT_LIMITS.max_payload_bytes
    try:
        with payload.open("rb") as file:
            data = file.read(limit + 1)  # enough to know it is over the limit
    except OSError as exc:
        raise IntakeError(f"{payload}: cannot be read ({exc.strerror or exc})") from exc
    try:
        return parse_payload(data, source, json_only=True)
    except IntakeError as exc:
        raise type(exc)(f"{payload}: {exc}") from exc


def checked_pipeline(pipeline: str, settings: Settings) -> Pipeline:
    """The pipeline a name or file gives, with every check of `baton pipeline check` passed.

    Raises:
        PipelineError: listing every problem, one a line, each naming the file, stage and field.
    """
    return check_pipeline(pipeline, queue=settings.queue, retry=settings.retry,
                          model=settings.model, prices=settings.prices).valid()  # fmt: skip


def read_environment(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """An environment spec to give a run: a TOML file's path, or its table already read;
    checked as the worker will read it, when the sandbox package is installed.

    Raises:
        EnvironmentFileError: the file cannot be read or the spec is not valid; the message
            names the file and each field that is wrong.
    """
    if isinstance(spec, Mapping):
        table, origin = dict(spec), "the environment spec"
    else:
        origin = str(spec)
        try:
            table = tomllib.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise EnvironmentFileError(f"{origin}: not a readable TOML file: {exc}") from exc
    for check in metadata.entry_points(group=CHECKS_GROUP, name="environment"):
        try:
            check.load()(table, origin=origin)
        except ValueError as exc:
            raise EnvironmentFileError(str(exc)) from exc
    try:
        json.dumps(table)
    except TypeError as exc:  # TOML dates and times: nothing a spec holds
        raise EnvironmentFileError(f"{origin}: {exc}") from exc
    return table


def enqueue(
    payload: Path | bytes | str | Mapping[str, Any],
    *,
    repo: str,
    ref: str | None = None,
    base: str | None = None,
    pipeline: str = "fixer",
    source: IssueSource | str | None = None,
    force: bool = False,
    environment: Mapping[str, Any] | str | Path | None = None,
    settings: Settings | None = None,
    budget: RunBudget | str | None = None,
) -> str:
    """Parse `payload` (Sentry event or issue, GitHub issue, pull request, or text; a `Path` is a
    payload file, which must hold JSON), pin the commit `ref` names in the repository (a branch,
    a tag or a sha; a pull request's head, else its HEAD by default), create a run and enqueue
    its first stage. Returns the run id. `environment`, a spec file's path (or its table),
    replaces the repository's environment spec for this run. `budget` (a `RunBudget`, or
    `tokens=…,calls=…,wall_s=…,iterations=…,cost_usd=…`) replaces those limits of the
    pipeline's `[run_budget]` for this run. `base` (a pull request's own by
    default) makes the run about a change: the diff from `base` to `ref`, which a pipeline that
    reviews changes (`{change}`) requires.

    Nothing is written when the payload, the pipeline or the repository is invalid.

    Raises:
        IntakeError: the payload is malformed (the message names the field), `ref` or `base`
            contradicts the pull request, or the pipeline reviews a change and there is no base.
        PipelineError: the pipeline is unknown or invalid (as `baton pipeline check` says).
        EnvironmentFileError: `environment` is not a valid spec; the message names the field.
        RepoError: the repository cannot be read, or a local path is not the root of a git
            repository (a folder inside one, a plain folder, a path that does not exist); the
            message names the path first.
        ConfigError: BATON_REDIS_URL is not set, or `budget` is not a valid budget (the
            message names the limit).
    """
    run_id, _ = submit(
        payload, repo=repo, ref=ref, base=base, pipeline=pipeline, source=source, force=force,
        environment=environment, settings=settings, budget=budget,
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


def resume(
    run_id: str,
    *,
    from_stage: str | None = None,
    pipeline: str | None = None,
    settings: Settings | None = None,
    budget: RunBudget | str | None = None,
) -> str:
    """Run a failed or cancelled run again from the stage that did not finish (or
    `from_stage`), keeping every output recorded before it, with the pipeline version the run
    pinned, or with the one `pipeline` (a name or file of the same pipeline) gives now, pinned
    from then on. `budget` (as `enqueue`'s) replaces the limits it names of the run's budget:
    a run its budget stopped goes on with a raised one, its spend so far carried over. Returns
    that stage's name.

    Raises:
        RunNotFoundError: no such run.
        RunStateError: the run has not ended, or it has nothing left to run, or its budget
            stopped it and no `budget` is given.
        PipelineError: the pipeline has no stage `from_stage`, `pipeline` is not valid or is
            another pipeline.
        ConfigError: `budget` is not a valid budget, or sets a cost limit on a model with no
            price.
    """
    settings = settings or Settings()
    limits = parse_budget(budget) if isinstance(budget, str) else budget
    latest = checked_pipeline(pipeline, settings) if pipeline is not None else None
    with connect(settings) as conductor:
        if limits is not None:
            run = conductor.store.get(run_id)
            spec = latest or conductor.pipeline_of(run)
            merged = (run.budget or RunBudget()).over(limits)
            check_priced(merged, spec, settings.model, settings.prices)
        return conductor.resume(run_id, from_stage, pipeline=latest, budget=limits)


def approve(
    run_id: str,
    *,
    gate: str | None = None,
    edit: Mapping[str, Any] | Path | None = None,
    by: str | None = None,
    settings: Settings | None = None,
) -> Approval:
    """Approve a run's gate (`gate`, or its one pending gate) so that the run goes on. `edit`
    (an object, or a JSON file's path) replaces the gated stage's output for every later stage;
    it must fit the stage's output schema, and the audit log keeps it with who approved
    (`by`, the user's login by default). Says whether it was applied (not if the gate was
    approved before: an approval is applied once) and the stage it queued, if any.

    Raises:
        RunNotFoundError: no such run.
        RunStateError: no such gate, several pending and none named, or it was rejected.
        PipelineError: the edit does not fit the stage's schema, or the gate is a diff's.
        NotJsonError: the edit file does not hold a JSON object.
    """
    edited = read_edit(edit) if isinstance(edit, Path) else edit
    with connect(settings or Settings()) as conductor:
        return conductor.approve(run_id, gate, by=by or _user(), edit=edited)


def reject(
    run_id: str,
    *,
    reason: str,
    gate: str | None = None,
    by: str | None = None,
    settings: Settings | None = None,
) -> bool:
    """Reject a run's gate (`gate`, or its one pending gate): the run ends `rejected` with
    `reason` and who gave it (`by`, the user's login by default). False if it was rejected
    before (nothing changes).

    Raises:
        RunNotFoundError: no such run.
        RunStateError: no such gate, it was approved, the run has ended, or no reason.
    """
    with connect(settings or Settings()) as conductor:
        return conductor.reject(run_id, gate, by=by or _user(), reason=reason)


def read_edit(path: Path) -> dict[str, Any]:
    """An approver's edit of a stage's output: a JSON object in a file.

    Raises:
        NotJsonError: the file cannot be read or holds no JSON object (the message names it).
    """
    try:
        edit = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotJsonError(f"{path}: the edit must be a JSON object: {exc}") from None
    if not isinstance(edit, dict):
        raise NotJsonError(f"{path}: the edit must be a JSON object, not {type(edit).__name__}")
    return edit


def _user() -> str:
    """Who decides a gate from this machine, for the audit log."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"

"""Where pipelines come from and which version a run runs.

A pipeline is named by its file's path or, once installed, by an entry point of the
`baton.pipelines` group (the fixer is one: pyproject.toml). A run pins the spec it was enqueued
with: its name and digest (`Pipeline.digest`) in the run record, the spec itself beside the run
(`keys.pipeline`), and every stage of the run executes that version (`pipeline_of`), parsed once
per process by digest, whatever the file says by then. Routing a stage (`stage_of`) reads the
pinned spec alone, without importing its schemas, which a process serving other pipelines may
not have.
"""

from __future__ import annotations

import json
import threading
import tomllib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.core.errors import PipelineError
from orchestrator.core.models import RunRecord
from orchestrator.core.pipeline import Pipeline, StageSpec, canonical_json, spec_digest, stage_queue
from orchestrator.core.store import RunStore
from orchestrator.core.toolcheck import check_tools

PIPELINES_GROUP = "baton.pipelines"
"""Entry point group naming installed pipelines: `name = "package.module:SPEC"`, where `SPEC` is
the TOML file's path (a `pathlib.Path` or an `importlib.resources` file)."""


def pipeline_from_table(
    table: Mapping[str, Any], *, origin: str, with_tools: bool = True
) -> Pipeline:
    """Validate a spec's table; the pipeline keeps the table as written (what a run pins).
    `with_tools`: its tools are checked too (`check_tools`, which imports host tools' modules);
    `baton pipeline check` checks them apart, to name each problem's stage and field.

    Raises:
        PipelineError: the spec is invalid; the message starts with `origin`.
    """
    try:
        pipeline = Pipeline.model_validate(table)
    except ValidationError as exc:
        raise PipelineError(f"{origin} is invalid: {exc}") from exc
    except PipelineError as exc:
        raise PipelineError(f"{origin} is invalid: {exc}") from exc
    pipeline._table = json.loads(canonical_json(table))
    problems = check_tools(pipeline) if with_tools else []
    if problems:
        lines = "\n".join(problem.describe(origin) for problem in problems)
        raise PipelineError(f"{origin} is invalid: its tools cannot run:\n{lines}")
    return pipeline


def parse_pipeline(text: str, *, origin: str) -> Pipeline:
    """A pipeline from its TOML text. Raises `PipelineError`, naming `origin`."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"{origin} is not valid TOML: {exc}") from exc
    return pipeline_from_table(table, origin=origin)


def installed_pipelines() -> dict[str, metadata.EntryPoint]:
    """The pipelines named by entry points of `PIPELINES_GROUP`, by name."""
    return {entry.name: entry for entry in metadata.entry_points(group=PIPELINES_GROUP)}


def pipeline_source(name_or_path: str) -> tuple[str, str]:
    """The TOML text of a pipeline named by file path or by entry point, and where it came from
    (for messages).

    Raises:
        PipelineError: neither a readable `.toml` file nor an installed pipeline's name.
    """
    path = Path(name_or_path)
    if path.suffix == ".toml" or "/" in name_or_path:
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise PipelineError(f"{path}: cannot read the pipeline file: {exc}") from exc
    installed = installed_pipelines()
    entry = installed.get(name_or_path)
    if entry is None:
        known = ", ".join(sorted(installed)) or "none"
        raise PipelineError(
            f"unknown pipeline {name_or_path!r}: not a .toml file, nor an installed pipeline "
            f"(entry points of {PIPELINES_GROUP}: {known})"
        )
    origin = f"pipeline {name_or_path!r} ({entry.value})"
    try:
        spec = entry.load()
        text: str = (Path(spec) if isinstance(spec, str) else spec).read_text(encoding="utf-8")
    except (ImportError, AttributeError, OSError) as exc:
        raise PipelineError(f"{origin} cannot be read: {exc}") from exc
    return text, origin


def load_pipeline(name_or_path: str) -> Pipeline:
    """A pipeline by file path (a name with `.toml` or a `/`) or by the name of an installed
    one, read now (an edited file is
    read as it is now; a run keeps the version it pinned).

    Raises:
        PipelineError: the pipeline is unknown or its file is invalid; the message says where.
    """
    text, origin = pipeline_source(name_or_path)
    return parse_pipeline(text, origin=origin)


PINNED_CACHE_SIZE = 64
"""Pinned specs a process keeps parsed, by digest."""
_tables: OrderedDict[str, dict[str, Any]] = OrderedDict()
_pipelines: OrderedDict[str, Pipeline] = OrderedDict()
_pinned_lock = threading.Lock()


def pinned_table(digest: str, content: Callable[[], str | None], *, origin: str) -> dict[str, Any]:
    """The table of the spec a run pinned, by its digest: read from `content()` (its canonical
    JSON) once per process and checked against the digest.

    Raises:
        PipelineError: the content is gone, does not match the digest, or is not a table; the
            message starts with `origin`.
    """
    with _pinned_lock:
        if digest in _tables:
            return _tables[digest]
    text = content()
    if text is None:
        raise PipelineError(f"{origin}: the pinned pipeline spec is missing")
    if spec_digest(text) != digest:
        raise PipelineError(f"{origin}: the pinned pipeline spec does not match its digest")
    try:
        table = json.loads(text)
    except ValueError as exc:
        raise PipelineError(f"{origin}: the pinned pipeline spec is not JSON: {exc}") from exc
    if not isinstance(table, dict):
        raise PipelineError(f"{origin}: the pinned pipeline spec is not a table")
    _remember(_tables, digest, table)
    return table


def pinned_pipeline(digest: str, content: Callable[[], str | None], *, origin: str) -> Pipeline:
    """The pipeline a run pinned, by its digest: validated once per process (cached by digest,
    never by name, so an edited spec is another entry).

    Raises:
        PipelineError: as `pinned_table`, or the spec is not a valid pipeline here (a schema
            this process cannot import, say).
    """
    with _pinned_lock:
        if digest in _pipelines:
            return _pipelines[digest]
    pipeline = pipeline_from_table(pinned_table(digest, content, origin=origin), origin=origin)
    _remember(_pipelines, digest, pipeline)
    return pipeline


def stage_in_table(table: Mapping[str, Any], stage: str, *, origin: str) -> StageSpec:
    """One stage of a spec's table, validated alone, its queue filled in: what routing it takes,
    without the pipeline's checks across stages (which import every output schema).

    Raises:
        PipelineError: the table has no such stage, or it is not valid.
    """
    stages = table.get("stages")
    listed = stages if isinstance(stages, list) else []
    found = [s for s in listed if isinstance(s, dict) and s.get("name") == stage]
    if not found:
        raise PipelineError(f"{origin}: the pipeline has no stage {stage!r}")
    try:
        spec = StageSpec.model_validate(found[0])
    except ValidationError as exc:
        raise PipelineError(f"{origin}: stage {stage!r} is invalid: {exc}") from exc
    if not spec.queue:
        object.__setattr__(spec, "queue", stage_queue(str(table.get("name")), spec.name))
    return spec


def _remember(cache: OrderedDict[str, Any], digest: str, value: Any) -> None:
    with _pinned_lock:
        cache[digest] = value
        cache.move_to_end(digest)
        while len(cache) > PINNED_CACHE_SIZE:
            cache.popitem(last=False)


def pipeline_of(store: RunStore, run: RunRecord) -> Pipeline:
    """The pipeline `run` executes: the version it pinned (parsed once per process, by its
    digest), or, for a run recorded before runs pinned one, what its name loads now.

    Raises:
        PipelineError: the pinned spec is missing, altered, or not valid in this process (a
            schema it cannot import, say); the message names the run and the pipeline.
    """
    if run.pipeline_hash is None:
        return load_pipeline(run.pipeline)
    return pinned_pipeline(
        run.pipeline_hash, lambda: store.pipeline_content(run.id), origin=_origin(run)
    )


def stage_of(store: RunStore, run: RunRecord, stage: str) -> StageSpec:
    """A stage of the pipeline `run` pinned, read from its spec alone: what sending it takes
    (queue, time limits), without importing the pipeline's schemas, which a process that
    serves other pipelines may not have.

    Raises:
        PipelineError: the pinned spec is missing, altered, or has no valid stage `stage`.
    """
    if run.pipeline_hash is None:
        return load_pipeline(run.pipeline).stage(stage)
    table = pinned_table(
        run.pipeline_hash, lambda: store.pipeline_content(run.id), origin=_origin(run)
    )
    return stage_in_table(table, stage, origin=_origin(run))


def _origin(run: RunRecord) -> str:
    """How messages name the pipeline a run pinned."""
    return f"run {run.id}: pipeline {run.pipeline!r} ({(run.pipeline_hash or '')[:12]})"

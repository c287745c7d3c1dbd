"""What `baton pipeline check` and `baton enqueue` find wrong with a pipeline spec, before a run
exists: each problem names the file, the stage and the field.

Checked here: the file is TOML, the fields are known and valid, stage names are unique, every
output schema imports, every `{key}` of an instruction names `{issue}`, `{change}` or an earlier
stage's output, and each stage fits the visibility timeout. Checked by the model of the spec
(`orchestrator.core.pipeline`), then localized here: the rules across stages (stop, verify,
reproduce, proof, loop, publish) and every model a stage names (`orchestrator.core.providers`).
Checked by `orchestrator.core.toolcheck`: every tool a stage names is built in or declared, and
every declared one can run (its function imports and is typed, its template splices nothing).
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from orchestrator.core.branches import BRANCH_KEY, ITEM_KEY
from orchestrator.core.errors import ConfigError, PipelineError
from orchestrator.core.pipeline import (
    CHANGE_KEY,
    ISSUE_KEY,
    PREVIOUS_ATTEMPT_KEY,
    Pipeline,
    import_schema,
    placeholders,
)
from orchestrator.core.prices import ModelPrice
from orchestrator.core.providers import litellm_missing, parse_model
from orchestrator.core.queue import check_time_limits
from orchestrator.core.runbudget import check_priced
from orchestrator.core.settings import QueueConfig, RetryConfig
from orchestrator.core.specs import pipeline_from_table, pipeline_source
from orchestrator.core.toolcheck import ToolProblem, check_tools

CHECKS_GROUP = "baton.checks"
"""Entry point group of the checks other packages lend the orchestrator: `environment` checks
an environment spec given at enqueue (the orchestrator cannot import the sandbox package)."""
_STAGE_NAMED = re.compile(r"stage '([^']+)'")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, and where."""

    origin: str
    """The file (or the installed pipeline) the spec came from."""
    stage: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = [self.origin]
        if self.stage is not None:
            where.append(f"stage {self.stage!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return f"{', '.join(where)}: {self.message}"


@dataclass(frozen=True)
class Checked:
    """A spec checked: the pipeline (None when it is not valid) and every problem found."""

    pipeline: Pipeline | None
    problems: list[Problem]

    def valid(self) -> Pipeline:
        """The pipeline, if nothing is wrong with it.

        Raises:
            PipelineError: listing every problem, one a line.
        """
        if self.pipeline is None or self.problems:
            raise PipelineError("\n".join(map(str, self.problems)))
        return self.pipeline


def check_pipeline(
    name_or_path: str,
    *,
    queue: QueueConfig | None = None,
    retry: RetryConfig | None = None,
    model: str | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> Checked:
    """Check a pipeline named by file or by entry point; with `queue` and `retry`, also that
    each stage fits the visibility timeout; with `model` (`BATON_MODEL`) and `prices`
    (`BATON_PRICES`), also that a `[run_budget]` cost limit can be kept (every model priced)."""
    try:
        text, origin = pipeline_source(name_or_path)
    except PipelineError as exc:
        return Checked(None, [Problem(name_or_path, None, None, str(exc))])
    return check_text(text, origin=origin, queue=queue, retry=retry, model=model, prices=prices)


def check_text(
    text: str,
    *,
    origin: str,
    queue: QueueConfig | None = None,
    retry: RetryConfig | None = None,
    model: str | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> Checked:
    """Check a spec's TOML text read from `origin`."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Checked(None, [Problem(origin, None, None, f"not valid TOML: {exc}")])
    problems = list(_structure(table, origin))
    try:
        pipeline = pipeline_from_table(table, origin=origin, with_tools=False)
    except PipelineError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            problems += _validation(table, cause, origin, problems)
        elif not problems:
            problems.append(Problem(origin, None, None, str(exc)))
        return Checked(None, problems)
    if problems:
        return Checked(None, problems)
    problems += [_tool_problem(found, origin) for found in check_tools(pipeline)]
    problems += _model_problems(pipeline, model, origin)
    if queue is not None and retry is not None:
        try:
            check_time_limits(pipeline, queue, retry)
        except ConfigError as exc:
            problems.append(Problem(origin, _stage_in(str(exc)), "budget.time_limit_s", str(exc)))
    if model is not None:
        try:
            check_priced(pipeline.run_budget, pipeline, model, prices)
        except ConfigError as exc:
            problems.append(Problem(origin, None, "run_budget.cost_usd", str(exc)))
    return Checked(pipeline if not problems else None, problems)


def _model_problems(pipeline: Pipeline, default: str | None, origin: str) -> list[Problem]:
    """A stage whose model needs a package that is not installed (LiteLLM, an extra)."""
    problems = []
    for stage in pipeline.stages:
        named = {"model": stage.model or pipeline.model or default}
        if stage.compaction is not None:
            named["compaction.model"] = stage.compaction.model
        for field, model in named.items():
            missing = litellm_missing(parse_model(model)) if model else None
            if missing is not None:
                problems.append(Problem(origin, stage.name, field, missing))
    return problems


def _stages(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    stages = table.get("stages")
    if not isinstance(stages, list):
        return []
    return [stage if isinstance(stage, dict) else {} for stage in stages]


def _stage_label(stage: Mapping[str, Any], index: int) -> str:
    name = stage.get("name")
    return name if isinstance(name, str) else f"#{index + 1}"


def _structure(table: Mapping[str, Any], origin: str) -> Iterable[Problem]:
    """What can be said of the table before the model sees it, each at its field."""
    stages = _stages(table)
    produced: dict[str, str] = {}  # output key → the stage that produces it
    for stage in stages:
        if isinstance(key := stage.get("output_key") or stage.get("name"), str):
            produced.setdefault(key, str(stage.get("name")))
    seen: set[str] = set()
    earlier = {ISSUE_KEY, CHANGE_KEY, PREVIOUS_ATTEMPT_KEY}
    for index, stage in enumerate(stages):
        label = _stage_label(stage, index)
        if label in seen:
            yield Problem(origin, label, "name", "another stage has this name; names must differ")
        seen.add(label)
        yield from _schema(stage, label, origin)
        instruction = stage.get("instruction")
        keys = placeholders(instruction) if isinstance(instruction, str) else []
        for key in dict.fromkeys(keys):
            if key not in earlier | _branch_keys(stage):
                yield Problem(origin, label, "instruction", _unknown_key(key, produced))
        if isinstance(key := stage.get("output_key") or stage.get("name"), str):
            earlier.add(key)


def _branch_keys(stage: Mapping[str, Any]) -> set[str]:
    """What a fan-out stage's branches read besides the outputs: `{branch}`, and a `map`
    stage's `{item}` (`orchestrator.core.branches`); the model's check says the rest."""
    keys = {BRANCH_KEY} if "parallel" in stage or "map" in stage else set()
    return keys | ({ITEM_KEY} if "map" in stage else set())


def _schema(stage: Mapping[str, Any], label: str, origin: str) -> Iterable[Problem]:
    schema = stage.get("output_schema")
    if isinstance(schema, str):
        try:
            import_schema(schema)
        except PipelineError as exc:
            yield Problem(origin, label, "output_schema", str(exc))


def _unknown_key(key: str, produced: Mapping[str, str]) -> str:
    if key in produced:
        return (
            f"{{{key}}} is the output of stage {produced[key]!r}, which runs later: a stage reads "
            "only {issue}, {change} and the outputs of the stages before it"
        )
    known = ", ".join(f"{{{k}}}" for k in [ISSUE_KEY, CHANGE_KEY, *produced])
    return f"{{{key}}} names no stage's output (known: {known}; write {{{{ for a literal brace)"


def _validation(
    table: Mapping[str, Any], error: ValidationError, origin: str, found: list[Problem]
) -> list[Problem]:
    """The model's errors, each at its stage and field; an error of the spec as a whole (a rule
    across stages) is put at the field without which it goes away."""
    stages = _stages(table)
    taken = {(p.stage, p.field) for p in found}
    problems = []
    for detail in error.errors():
        loc, message = detail["loc"], _message(detail)
        if loc and loc[0] == "stages" and len(loc) > 1 and isinstance(loc[1], int):
            index = loc[1]
            stage = _stage_label(stages[index], index) if index < len(stages) else f"#{index + 1}"
            field = ".".join(map(str, loc[2:])) or None
        elif loc:
            stage, field = None, ".".join(map(str, loc))
        elif found:
            continue  # a consequence of what was found already (a schema that does not import)
        else:
            stage, field = _localize(table, message)
        if (stage, field) not in taken:
            problems.append(Problem(origin, stage, field, message))
            taken.add((stage, field))
    return problems


def _message(detail: Mapping[str, Any]) -> str:
    if detail["type"] == "extra_forbidden":
        return "unknown field"
    return str(detail["msg"]).removeprefix("Value error, ")


def _localize(table: Mapping[str, Any], message: str) -> tuple[str | None, str | None]:
    """The stage and field of an error of the whole spec: the first field (of the stages the
    message names first) without which, or with an empty value, the spec is valid — or, failing
    that (it has more than one such error), no longer says this one."""
    stages = _stages(table)
    named = _STAGE_NAMED.findall(message)
    order = sorted(range(len(stages)), key=lambda i: stages[i].get("name") not in named)
    trials = [
        (index, field, variant)
        for index in order
        for field, value in stages[index].items()
        if field != "name"
        for variant in _without(stages[index], field, value)
    ]
    outcomes = []
    for index, field, variant in trials:
        trial = copy.deepcopy(dict(table))
        trial["stages"][index] = variant
        outcome = _model_error(trial)
        if outcome is None:
            return _stage_label(stages[index], index), field
        outcomes.append((index, field, outcome))
    for index, field, outcome in outcomes:
        if outcome not in (message, _FIELD_ERRORS):
            return _stage_label(stages[index], index), field
    return (named[0] if named else None), None


_FIELD_ERRORS = "\0fields"


def _without(stage: Mapping[str, Any], field: str, value: Any) -> list[dict[str, Any]]:
    """The stage without `field`, then with it empty."""
    removed = {k: v for k, v in stage.items() if k != field}
    empty = {str: "", bool: False, list: [], dict: {}}.get(type(value))
    return [removed] if empty is None else [removed, {**stage, field: empty}]


def _model_error(table: Mapping[str, Any]) -> str | None:
    """None if the table is a valid pipeline; `_FIELD_ERRORS` if a field is wrong; else the
    message of its error as a whole."""
    try:
        Pipeline.model_validate(table)
    except ValidationError as exc:
        details = exc.errors()
        if any(detail["loc"] for detail in details):
            return _FIELD_ERRORS
        return _message(details[0])
    except PipelineError as exc:
        return str(exc)
    return None


def _tool_problem(found: ToolProblem, origin: str) -> Problem:
    """A tool's problem at its stage (the first that names the tool) and its field: a stage's
    `tools` list, or the declaration's own field (`tools.<name>.command[2]`)."""
    stage = found.stages[0] if found.stages else None
    field = "tools" if not found.field or found.field.startswith("stages[") else found.field
    return Problem(origin, stage, field, f"tool {found.tool!r}: {found.message}")


def _stage_in(message: str) -> str | None:
    match = _STAGE_NAMED.search(message)
    return match.group(1) if match else None

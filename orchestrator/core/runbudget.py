"""A run's budget: limits on what all its executions together may spend.

A pipeline sets one in its `[run_budget]` table; `baton enqueue --budget tokens=…,calls=…`
(the API's `budget=`) overrides it limit by limit for one run. Every limit is optional; an
unset one is not enforced. The spend itself is counted in Redis (`orchestrator.core.spend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import ConfigError
from orchestrator.core.prices import ModelPrice, price_of


class RunBudget(BaseModel):
    """Limits on one run, across every stage, attempt, iteration and branch of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = Field(None, gt=0)
    """Model tokens: prompt, reply and thoughts of every call."""
    calls: int | None = Field(None, gt=0)
    """Model calls (each attempt sent counts, a retry too)."""
    wall_s: float | None = Field(None, gt=0)
    """Seconds from the run's creation to its end."""
    iterations: int | None = Field(None, gt=0)
    """Iterations of a looped stage."""
    handoffs: int | None = Field(None, gt=0)
    """Hand-offs: a stage handing the run to the next one, a loop's next iteration, each
    branch of a fan-out, each subagent started (`orchestrator.core.handoffs`)."""
    cost_usd: float | None = Field(None, gt=0)
    """Estimated cost in US dollars (`orchestrator.core.prices`)."""

    @property
    def is_empty(self) -> bool:
        return not self.model_dump(exclude_none=True)

    def over(self, override: RunBudget | None) -> RunBudget:
        """This budget with the limits `override` sets in place of its own."""
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_none=True))

    def describe(self) -> str:
        """`tokens=…,calls=…`, the form `parse_budget` reads; `none` without limits."""
        set_ = self.model_dump(exclude_none=True)
        return ",".join(f"{name}={_figure(value)}" for name, value in set_.items()) or "none"


LIMITS = tuple(RunBudget.model_fields)
"""The limits a budget may set, in the order they are shown."""


def parse_budget(text: str) -> RunBudget:
    """`tokens=200000,calls=40,wall_s=1800,cost_usd=2.5` as a `RunBudget`.

    Raises:
        ConfigError: naming the part that is not `limit=number` or the limit that is unknown
            or out of range.
    """
    fields: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not value.strip():
            raise ConfigError(f"--budget: {part!r} is not limit=number (limits: {_names()})")
        if name not in LIMITS:
            raise ConfigError(f"--budget: unknown limit {name!r} (limits: {_names()})")
        if name in fields:
            raise ConfigError(f"--budget: {name!r} is given twice")
        fields[name] = value.strip()
    if not fields:
        raise ConfigError(f"--budget: no limit given (limits: {_names()})")
    try:
        return RunBudget.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"--budget: {problems}") from exc


def _names() -> str:
    return ", ".join(LIMITS)


def _figure(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def run_budget(pipeline: Any, override: RunBudget | None) -> RunBudget | None:
    """The budget a new run of `pipeline` gets: its `[run_budget]` with `override`'s limits
    in place of its own; None when neither sets a limit."""
    merged = (pipeline.run_budget or RunBudget()).over(override)
    return None if merged.is_empty else merged


def check_priced(
    budget: RunBudget | None,
    pipeline: Any,
    default_model: str,
    prices: Mapping[str, ModelPrice] | None = None,
) -> None:
    """Refuse a cost limit the run could not keep: one of its stages (or a stage's compaction)
    runs on a model that has no price, neither in the table nor in `prices` (`BATON_PRICES`),
    so its calls would not count against the limit. `default_model`: `BATON_MODEL`, the model
    of a stage that names none.

    Raises:
        ConfigError: naming each such model and the stages that run on it.
    """
    if budget is None or budget.cost_usd is None:
        return
    unpriced: dict[str, list[str]] = {}
    for stage in pipeline.stages:
        models = {pipeline.model_of(stage, default_model)}
        if stage.compaction is not None and stage.compaction.model:
            models.add(stage.compaction.model)
        for model in sorted(models):
            if price_of(model, prices) is None:
                unpriced.setdefault(model, []).append(stage.name)
    if unpriced:
        which = "; ".join(
            f"model {model!r} (stage{'s' if len(stages) > 1 else ''} {', '.join(stages)})"
            for model, stages in unpriced.items()
        )
        raise ConfigError(
            f"cost_usd={_figure(budget.cost_usd)}: the cost of {which} cannot be estimated: it "
            "has no price in orchestrator/core/prices.py; give it one in BATON_PRICES "
            '(\'{"<model>": {"input_usd_per_mtok": …, "output_usd_per_mtok": …}}\'), or leave '
            "cost_usd out of the budget"
        )


def wall_time_exceeded(run: Any, now: float) -> str | None:
    """Why `run` (a `RunRecord`) is past its wall-time limit at `now`, in the words of a
    refused call (`orchestrator.core.spend`); None if it is not, or has none."""
    budget: RunBudget | None = run.budget
    if budget is None or budget.wall_s is None or run.status.is_terminal:
        return None
    elapsed_s = now - run.created_at
    if elapsed_s <= budget.wall_s:
        return None
    return f"wall time: {elapsed_s:.0f}s since the run began, limit {budget.wall_s!r}s"

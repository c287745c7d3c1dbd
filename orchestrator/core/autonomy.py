"""Confidence-gated autonomy: how far a run goes on its own, by a score a stage reports.

A pipeline may declare where a score comes from (a number field of a stage's output, the
fixability its triage reports, say) and levels by that score, per repository or for all:

    [autonomy]
    score = "triage.fixability"
    levels = [
      { min_score = 0.8 },                          # go all the way (publish)
      { min_score = 0.5, gate_before = "pr" },      # a person approves before publishing
      { min_score = 0.2, stop_after = "plan" },     # a plan, no change
      { min_score = 0.0, stop_after = "search" },   # the root cause only
    ]
    [autonomy.repos."https://github.com/o/shop"]
    levels = [{ min_score = 0.0, gate_before = "pr" }]

The level that applies is the one with the highest `min_score` at or below the score (a score
below every level stops after the scoring stage). It acts when a stage completes, inside the
conductor's transaction: `stop_after` ends the run `skipped` after that stage, with the score
and the level as its reason; `gate_before` opens a gate (`orchestrator.core.gates`) on the stage
before it, a `diff` gate when that stage left artifacts, else a `plan` gate. The score is read
from the recorded output each time, so the decision needs no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core.gates import GateRule
from orchestrator.core.git import repo_identity
from orchestrator.core.rules import split_source, value_at

if TYPE_CHECKING:
    from orchestrator.core.pipeline import Pipeline


class Level(BaseModel):
    """How far a run goes at a score of at least `min_score`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_score: float
    stop_after: str | None = None
    """End the run after this stage."""
    gate_before: str | None = None
    """A person approves before this stage runs (the stage before it gets a gate)."""

    @model_validator(mode="after")
    def _one_limit(self) -> Level:
        if self.stop_after is not None and self.gate_before is not None:
            raise ValueError("a level either stops after a stage or gates before one, not both")
        return self


class Levels(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    levels: tuple[Level, ...] = Field(min_length=1)


class Autonomy(BaseModel):
    """A pipeline's autonomy rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: str = Field(pattern=r"^[A-Za-z_][\w:-]*\.[\w.]+$")
    """`<output_key>.<field>`: a number a stage reports."""
    levels: tuple[Level, ...] = Field(min_length=1)
    repos: dict[str, Levels] = Field(default_factory=dict)
    """Levels for one repository, instead of `levels`: matched however a run spells it
    (`orchestrator.core.git.repo_identity`: `.git`, a trailing `/`, the ssh form, a user,
    upper case all name the same repository)."""

    @model_validator(mode="after")
    def _one_entry_per_repository(self) -> Autonomy:
        seen: dict[str, str] = {}
        for name in self.repos:
            same = seen.setdefault(repo_identity(name), name)
            if same != name:
                raise ValueError(f"autonomy.repos names one repository twice: {same!r}, {name!r}")
        return self

    def level(self, repo: str, score: float) -> Level | None:
        """The level for `score` in `repo`; None below every level."""
        mine = {repo_identity(name): levels for name, levels in self.repos.items()}
        found = mine.get(repo_identity(repo))
        levels = found.levels if found is not None else self.levels
        met = [level for level in levels if level.min_score <= score]
        return max(met, key=lambda level: level.min_score) if met else None


@dataclass(frozen=True)
class Effect:
    """What autonomy does once a stage completes: stop the run, or gate it."""

    reason: str
    stop: bool = False
    gate: GateRule | None = None


def effect(
    pipeline: Pipeline, repo: str, stage: str, output_of: Callable[[str], Mapping[str, Any] | None],
    *, left_artifacts: bool,
) -> Effect | None:  # fmt: skip
    """What autonomy does after `stage` of a run of `pipeline` on `repo`; `output_of` reads a
    recorded output by key. None: nothing (no rule, no score yet, or the level lets it go on).
    """
    rule = pipeline.autonomy
    if rule is None:
        return None
    key, field = split_source(rule.score)
    output = output_of(key)
    if output is None:
        return None
    found = value_at(output, field)
    score = float(found) if isinstance(found, int | float) else float("-inf")  # none: least
    level = rule.level(repo, score)
    names = [spec.name for spec in pipeline.stages]
    scored = pipeline.producing(key).name
    stop_after = scored if level is None else level.stop_after
    said = f"autonomy: {rule.score} is {score:g}"
    if stop_after == stage:
        floor = f"at least {level.min_score:g}" if level else "below every level"
        return Effect(reason=f"{said} ({floor}): the run stops after {stage}", stop=True)
    if level is not None and level.gate_before is not None:
        before = names[names.index(level.gate_before) - 1]
        if before == stage:
            approve = "diff" if left_artifacts else "plan"
            return Effect(
                reason=f"{said} (at least {level.min_score:g}): a person approves before "
                f"{level.gate_before}",
                gate=GateRule(approve=approve),
            )
    return None


def check(
    autonomy: Autonomy, pipeline_stages: Sequence[Any], earlier_keys: Mapping[str, Any]
) -> None:
    """The rule names stages the pipeline has, a score an earlier stage's schema holds, and no
    gate before the first stage.

    Raises:
        ValueError: naming what is wrong.
    """
    names = [stage.name for stage in pipeline_stages]
    key, field = split_source(autonomy.score)
    if key not in earlier_keys:
        raise ValueError(f"autonomy.score {autonomy.score!r}: no stage outputs {key!r}")
    schema = earlier_keys[key].schema_class()
    if field.split(".")[0] not in schema.model_fields:
        raise ValueError(
            f"autonomy.score {autonomy.score!r}: {schema.__name__} has no field {field!r}"
        )
    scored = names.index(earlier_keys[key].name)
    every = [("levels", autonomy.levels)] + [
        (f"repos.{repo!r}.levels", levels.levels) for repo, levels in autonomy.repos.items()
    ]
    for where, levels in every:
        for level in levels:
            for limit in ("stop_after", "gate_before"):
                name = getattr(level, limit)
                if name is None:
                    continue
                if name not in names:
                    raise ValueError(f"autonomy.{where}: {limit} names no stage: {name!r}")
                if names.index(name) < scored + (1 if limit == "gate_before" else 0):
                    raise ValueError(
                        f"autonomy.{where}: {limit} {name!r} comes before the score is known "
                        f"(stage {names[scored]!r})"
                    )

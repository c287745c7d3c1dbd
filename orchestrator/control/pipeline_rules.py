"""The rules of a pipeline that `baton pipeline show` spells out beside its stages: each
stage's gate and fan-out, the pipeline's `[autonomy]` and `[run_budget]`, in words and as JSON.

Every text here is made from a checked spec (`orchestrator.core.pipeline.Pipeline`), whose
names are patterns of plain characters; a repository URL in `[autonomy.repos]` is the author's
own, and goes through `orchestrator.control.plain.safe` like any shown text.
"""

from __future__ import annotations

from typing import Any

from orchestrator.control.plain import safe
from orchestrator.core.autonomy import Autonomy, Level
from orchestrator.core.pipeline import Pipeline, StageSpec


def gate_text(stage: StageSpec) -> str:
    """`gate: approve plan, timeout 3600s then escalate`; empty without a gate."""
    gate = stage.gate
    if gate is None:
        return ""
    said = f"gate: approve {gate.approve}"
    if gate.timeout_s is not None:
        said += f", timeout {gate.timeout_s:g}s then {gate.on_timeout}"
    return said


def fan_text(stage: StageSpec) -> str:
    """`3 branches in parallel, select by proof`, `a branch per item of search.files, select
    by judge pick.branch`; empty for a stage that does not fan out."""
    if stage.parallel is not None:
        said = f"{stage.parallel} branches in parallel"
    elif stage.map is not None:
        said = f"a branch per item of {stage.map}"
    else:
        return ""
    select = stage.select
    if select is None:
        return said
    if select.judge is None:
        return f"{said}, select by proof"
    return f"{said}, select by judge {select.judge}.{select.field}"


def autonomy_lines(rule: Autonomy | None) -> list[str]:
    """`autonomy by triage.fixability:` then one line per level, highest first, and per
    repository; nothing without a rule."""
    if rule is None:
        return []
    lines = [f"autonomy by {rule.score}:", *_levels(rule.levels, "  ")]
    for repo, levels in rule.repos.items():
        lines += [f"  in {safe(repo)}:", *_levels(levels.levels, "    ")]
    return lines


def _levels(levels: tuple[Level, ...], pad: str) -> list[str]:
    return [
        f"{pad}≥ {level.min_score:g}: {_level(level)}"
        for level in sorted(levels, key=lambda level: -level.min_score)
    ]


def _level(level: Level) -> str:
    if level.stop_after is not None:
        return f"stops after {level.stop_after}"
    if level.gate_before is not None:
        return f"a person approves before {level.gate_before}"
    return "goes all the way"


def budget_text(found: Pipeline) -> str:
    """`run budget: tokens=200000,calls=40` (what `enqueue --budget` overrides), or that the
    pipeline sets none."""
    if found.run_budget is None or found.run_budget.is_empty:
        return "run budget: none (enqueue --budget sets one per run)"
    return f"run budget: {found.run_budget.describe()}"


def stage_rules_json(stage: StageSpec) -> dict[str, Any]:
    """A stage's gate and fan-out for scripts: `gate` (its rule, or null), `parallel`, `map`
    and `select` (`proof`, `{judge, field}`, or null)."""
    select: Any = None
    if stage.select is not None:
        select = "proof" if stage.select.by_facts else stage.select.model_dump(mode="json")
    return {
        "gate": stage.gate.model_dump(mode="json") if stage.gate is not None else None,
        "parallel": stage.parallel,
        "map": stage.map,
        "select": select,
    }


def pipeline_rules_json(found: Pipeline) -> dict[str, Any]:
    """The pipeline's `autonomy` and `run_budget` for scripts (null when not set)."""
    return {
        "autonomy": found.autonomy.model_dump(mode="json") if found.autonomy else None,
        "run_budget": found.run_budget.model_dump(mode="json", exclude_none=True)
        if found.run_budget is not None
        else None,
    }

"""Confidence-gated autonomy: a pipeline's levels by a stage's score decide how far a run goes
— the rule checked when the pipeline loads, and carried out by the conductor against a real
Redis (stop after a stage, a gate before one, or all the way), per repository."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.core import autonomy
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import PipelineError
from orchestrator.core.execution import StageFigures, StageResult
from orchestrator.core.models import ArtifactRef, GateStatus, Issue, IssueSource, RunStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from orchestrator.core.specs import pipeline_from_table
from orchestrator.core.store import RunStore


class Scored(BaseModel):
    """A triage that says how fixable the issue looks."""

    fixability: float | None
    summary: str = ""


SCORED = "tests.orchestrator.test_autonomy:Scored"
SUMMARY = "orchestrator.pipelines.schemas:Summary"
STAGES = ("triage", "plan", "fix", "pr")
LEVELS = [
    {"min_score": 0.8},
    {"min_score": 0.5, "gate_before": "pr"},
    {"min_score": 0.2, "stop_after": "plan"},
]
STRICT = "/srv/git/payments"


def table(**rule: Any) -> dict[str, Any]:
    stages = [{"name": "triage", "instruction": "{issue}", "output_schema": SCORED}] + [
        {"name": name, "instruction": "{triage}", "output_schema": SUMMARY} for name in STAGES[1:]
    ]
    levels = {"score": "triage.fixability", "levels": LEVELS,
              "repos": {STRICT: {"levels": [{"min_score": 0.0, "gate_before": "pr"}]}}}  # fmt: skip
    return {"name": "autonomous", "stages": stages, "autonomy": levels | rule}


def effects(pipeline: Pipeline, score: float | None, repo: str = "/r") -> dict[str, str]:
    """What autonomy does after each stage, for a triage that reported `score`."""
    found = {}
    for stage in STAGES:
        done = autonomy.effect(
            pipeline, repo, stage, lambda _key: {"fixability": score}, left_artifacts=stage == "fix"
        )
        if done is not None:
            found[stage] = "stop" if done.stop else f"gate:{done.gate.approve if done.gate else ''}"
    return found


@pytest.mark.parametrize(
    ("score", "repo", "expected"),
    [
        (0.95, "/r", {}),
        (0.8, "/r", {}),
        (0.6, "/r", {"fix": "gate:diff"}),
        (0.3, "/r", {"plan": "stop"}),
        (0.1, "/r", {"triage": "stop"}),  # below every level: the root cause only
        (None, "/r", {"triage": "stop"}),  # no score: the least autonomy
        (0.95, STRICT, {"fix": "gate:diff"}),  # this repository always gates
    ],
)
def test_the_level_for_the_score_and_repository_decides(
    score: float | None, repo: str, expected: dict[str, str]
) -> None:
    assert effects(pipeline_from_table(table(), origin="t"), score, repo) == expected


FORGE = "https://github.com/o/payments"
ALWAYS_GATE = {FORGE: {"levels": [{"min_score": 0.0, "gate_before": "pr"}]}}


@pytest.mark.parametrize(
    "spelled",
    [
        FORGE, FORGE + ".git", FORGE + "/", "https://GitHub.com/O/Payments",
        "https://someone@github.com/o/payments", "ssh://git@github.com/o/payments.git",
        "git@github.com:o/payments", "https://github.com/o/%70ayments",
        "https://github.com//o/payments//", "  https://github.com/o/payments  ",
    ],
)  # fmt: skip
def test_a_strict_repository_is_strict_however_a_run_spells_it(spelled: str) -> None:
    strict = pipeline_from_table(table(repos=ALWAYS_GATE), origin="t")
    assert effects(strict, 0.95, spelled) == {"fix": "gate:diff"}
    assert effects(strict, 0.95, "https://github.com/o/other") == {}


def test_one_repository_named_twice_in_a_rule_is_refused() -> None:
    twice = {**ALWAYS_GATE, FORGE + ".git": ALWAYS_GATE[FORGE]}
    with pytest.raises(PipelineError, match="names one repository twice"):
        pipeline_from_table(table(repos=twice), origin="autonomous.toml")


@pytest.mark.parametrize(
    ("rule", "fault"),
    [
        ({"score": "search.fixability"}, "no stage outputs 'search'"),
        ({"score": "triage.confidence"}, "Scored has no field 'confidence'"),
        ({"levels": [{"min_score": 0, "stop_after": "deploy"}]}, "stop_after names no stage"),
        ({"levels": [{"min_score": 0, "gate_before": "triage"}]}, "comes before the score"),
        ({"levels": [{"min_score": 0, "gate_before": "pr", "stop_after": "plan"}]}, "not both"),
    ],
)
def test_a_rule_that_cannot_hold_is_refused_naming_it(rule: dict[str, Any], fault: str) -> None:
    with pytest.raises(PipelineError, match=fault):
        pipeline_from_table(table(**rule), origin="autonomous.toml")


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def run_through(conductor: Conductor, score: float, repo: str = "/r") -> str:
    """A run that reports `score` at triage, driven stage by stage while it goes on."""
    issue = Issue(source=IssueSource.TEXT, title=f"Checkout crashes ({score}, {repo})")
    run_id, _ = conductor.submit(issue, repo=repo, commit="c", pipeline=table_pipeline())
    outputs = {"triage": {"fixability": score}, "plan": {"summary": "p"}, "fix": {"summary": "f"}}
    for stage in STAGES:
        run = conductor.store.get(run_id)
        if run.status.is_terminal or run.status == RunStatus.AWAITING_APPROVAL:
            break
        assert (run.current_stage, run.stages[stage].status) == (stage, "queued")
        conductor.begin(run_id, stage, owner="w:1:t", lease_s=30, max_interrupted=3)
        diff = conductor.store.put_artifact(run_id, f"{stage}/workspace.diff", b"+x\n")
        figures = StageFigures(artifacts={"workspace.diff": diff} if stage == "fix" else {})
        result = StageResult(outputs.get(stage, {"summary": "pr"}), figures)
        conductor.complete(run_id, stage, result, owner="w:1:t")
    return run_id


def table_pipeline() -> Pipeline:
    return pipeline_from_table(table(), origin="autonomous")


def test_a_low_score_stops_after_the_plan_with_the_reason(conductor: Conductor) -> None:
    run = conductor.store.get(run_through(conductor, 0.3))
    assert run.status == RunStatus.SKIPPED
    assert run.reason == (
        "autonomy: triage.fixability is 0.3 (at least 0.2): the run stops after plan"
    )
    assert [run.stages[s].status for s in STAGES] == ["done", "done", "skipped", "skipped"]


def test_a_middling_score_gates_before_publishing_on_the_diff(conductor: Conductor) -> None:
    run_id = run_through(conductor, 0.6)
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.AWAITING_APPROVAL
    gate = run.gates["fix"]
    assert (gate.approve, gate.status, gate.artifacts) == ("diff", GateStatus.PENDING,
                                                           ["workspace.diff"])  # fmt: skip
    assert conductor.approve(run_id, by="ana").queued == "pr"


def test_a_high_score_goes_all_the_way_but_not_in_a_strict_repository(
    conductor: Conductor,
) -> None:
    assert conductor.store.get(run_through(conductor, 0.9)).status == RunStatus.DONE
    strict = conductor.store.get(run_through(conductor, 0.9, STRICT))
    assert strict.status == RunStatus.AWAITING_APPROVAL and list(strict.gates) == ["fix"]
    assert isinstance(strict.stages["fix"].artifacts["workspace.diff"], ArtifactRef)

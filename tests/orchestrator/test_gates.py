"""The gate state machine on run records (no Redis): each decision is applied once, keyed by
the gate's id, and a decided gate cannot be decided the other way."""

from __future__ import annotations

import pytest

from orchestrator.core import gates
from orchestrator.core.errors import PipelineError, RunStateError
from orchestrator.core.gates import GateRule
from orchestrator.core.models import (
    GateStatus,
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
)
from orchestrator.core.pipeline import StageSpec

ISSUE = Issue(source=IssueSource.TEXT, title="t")
PLAN_GATE = GateRule(approve="plan")


def parked(*stages: str, rule: GateRule = PLAN_GATE, now: float = 100.0) -> RunRecord:
    run = RunRecord(id="r1", pipeline="p", repo="/r", commit="c", issue=ISSUE, idempotency_key="k")
    for stage in stages:
        gates.open_gate(run, stage, rule, artifacts=[], now=now, output_key=stage)
    return run


def test_a_parked_run_awaits_approval_and_holds_its_stage() -> None:
    run = parked("plan")
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert gates.holds(run, "plan") and gates.holds(run, "fix")  # parked: nothing goes on
    assert list(gates.pending(run)) == ["plan"]
    gates.approve(run, "plan", by="ana", edited=False, now=110.0)
    assert not gates.holds(run, "plan")


def test_approving_twice_is_applied_once() -> None:
    run = parked("plan")
    first = gates.approve(run, "plan", by="ana", edited=False, now=110.0)
    second = gates.approve(run, "plan", by="bob", edited=True, now=120.0)

    assert (first, second) == (True, False)
    gate = run.gates["plan"]
    assert (gate.status, gate.decided_by, gate.decided_at, gate.edited) == (
        GateStatus.APPROVED, "ana", 110.0, False,
    )  # fmt: skip
    assert run.status == RunStatus.QUEUED
    assert not gates.holds(run, "plan")


def test_approving_after_a_rejection_is_refused_with_the_reason() -> None:
    run = parked("plan")
    assert gates.reject(run, "plan", by="ana", reason="touches the billing code", now=110.0)

    with pytest.raises(RunStateError, match=r"was rejected .touches the billing code.; it cannot"):
        gates.approve(run, "plan", by="bob", edited=False, now=120.0)
    assert run.status == RunStatus.REJECTED
    assert run.reason == "plan: rejected by ana: touches the billing code"


def test_rejecting_an_approved_gate_is_refused_and_rejecting_twice_changes_nothing() -> None:
    approved, rejected = parked("plan"), parked("plan")
    gates.approve(approved, "plan", by="ana", edited=False, now=110.0)
    gates.reject(rejected, "plan", by="ana", reason="no", now=110.0)

    with pytest.raises(RunStateError, match="was approved already"):
        gates.reject(approved, "plan", by="bob", reason="late", now=120.0)
    assert not gates.reject(rejected, "plan", by="bob", reason="again", now=120.0)
    assert rejected.gates["plan"].reason == "no"


def test_a_rejection_needs_a_reason() -> None:
    with pytest.raises(RunStateError, match="needs a reason"):
        gates.reject(parked("plan"), "plan", by="ana", reason="  ", now=110.0)


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_two_pending_gates_are_approved_in_either_order(order: tuple[str, str]) -> None:
    run = parked("a", "b")
    first, second = order

    assert gates.approve(run, first, by="ana", edited=False, now=110.0)
    assert run.status == RunStatus.AWAITING_APPROVAL  # the other still waits
    assert gates.holds(run, first)  # so nothing goes on past the approved one yet
    assert list(gates.pending(run)) == [second]
    assert gates.approve(run, second, by="ana", edited=False, now=120.0)
    assert not gates.approve(run, first, by="ana", edited=False, now=130.0)

    assert run.status == RunStatus.QUEUED
    assert {name: g.decided_at for name, g in run.gates.items()} == {
        first: 110.0, second: 120.0,
    }  # fmt: skip


def test_choosing_a_gate_needs_its_id_when_several_are_pending() -> None:
    run = parked("a", "b")
    with pytest.raises(RunStateError, match=r"has 2 gates awaiting approval .a, b.; name one"):
        gates.choose(run, None)
    with pytest.raises(RunStateError, match=r"has no gate 'c' .its gates: a, b."):
        gates.choose(run, "c")
    assert gates.choose(run, "b") == "b"


def test_a_decision_sent_twice_without_an_id_meets_the_gate_decided_last() -> None:
    run = parked("plan")
    gates.approve(run, gates.choose(run, None), by="ana", edited=False, now=110.0)
    assert gates.choose(run, None) == "plan"


def test_a_timeout_fails_the_run_or_escalates_once() -> None:
    failing = parked("plan", rule=GateRule(approve="plan", timeout_s=60))
    escalating = parked("plan", rule=GateRule(approve="plan", timeout_s=60, on_timeout="escalate"))

    assert gates.overdue(failing, now=159.0) == {}
    assert gates.time_out(failing, "plan", now=161.0) == "expired"
    assert failing.status == RunStatus.FAILED
    assert failing.reason == "plan: gate plan: no decision within 61s"
    assert gates.resume_point(failing) == "plan"

    assert gates.time_out(escalating, "plan", now=161.0) == "escalated"
    assert gates.overdue(escalating, now=500.0) == {}  # escalated once
    assert escalating.status == RunStatus.AWAITING_APPROVAL
    assert gates.approve(escalating, "plan", by="ana", edited=False, now=600.0)


def stage(output_schema: str = "orchestrator.pipelines.fixer.schemas:Plan") -> StageSpec:
    return StageSpec(name="plan", instruction="plan", output_schema=output_schema)


def test_an_edit_is_checked_against_the_stage_schema() -> None:
    gate = parked("plan").gates["plan"]
    edit = {"approach": "a", "steps": ["s"], "files_to_change": ["x.py"], "test_command": "t"}
    assert gates.checked_edit(stage(), gate, edit, {}) == edit

    with pytest.raises(PipelineError, match=r"stage plan does not fit .*steps: List should have"):
        gates.checked_edit(stage(), gate, edit | {"steps": []}, {})


def test_an_edit_cannot_change_what_baton_measured() -> None:
    reproduce = stage("orchestrator.pipelines.fixer.schemas:Reproduction")
    gate = parked("plan").gates["plan"]
    measured = {"command": "python -m unittest t", "exit_code": 1,
                "failed_tests": ["t.T.test_x"], "expected_failure_seen": True,
                "report_check": "KeyError raised in f, as the report shows"}  # fmt: skip
    said = {"test_files": ["t.py"], "test_command": "python -m unittest t",
            "expected_failure": "ZeroDivisionError", "explanation": "divides by 0"}  # fmt: skip
    forged = said | {"explanation": "edited", "reproduced": measured | {"exit_code": 0}}
    kept = gates.checked_edit(reproduce, gate, forged, said | {"reproduced": measured})
    assert kept["reproduced"] == measured, "the measured run stays as Baton measured it"
    assert kept["explanation"] == "edited", "what the model said is the approver's to edit"


def test_a_diff_gate_is_not_edited() -> None:
    gate = parked("plan", rule=GateRule(approve="diff")).gates["plan"]
    with pytest.raises(PipelineError, match="approved or rejected as it is"):
        gates.checked_edit(stage(), gate, {"approach": "a"}, {})


def test_a_gate_rule_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="approve"):
        StageSpec(name="plan", instruction="p", output_schema=stage().output_schema,
                  gate={"approve": "everything"})  # type: ignore[arg-type]  # fmt: skip

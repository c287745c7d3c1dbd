"""Gates through the conductor and the reconciler, against a real Redis: a gated stage parks
its run with nothing queued, a decision is applied once, and the next stage reads the edit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestrator.core import keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import PipelineError, RunStateError
from orchestrator.core.execution import StageFigures, StageResult
from orchestrator.core.gates import Approval
from orchestrator.core.models import (
    GateStatus,
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
    StageStatus,
)
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.settings import QueueConfig
from orchestrator.core.specs import pipeline_from_table
from orchestrator.core.store import RunStore

from .test_conductor import queued_task_ids

ISSUE = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart")
SUMMARY = "orchestrator.pipelines.schemas:Summary"
PROPOSED = {"summary": "change cart.py"}
EDITED = {"summary": "change cart.py and add a test"}


def gated(**gate: Any) -> Pipeline:
    table = {
        "name": "gated",
        "stages": [
            {"name": "plan", "instruction": "{issue}", "output_schema": SUMMARY,
             "gate": {"approve": "plan", **gate}},
            {"name": "act", "instruction": "{plan}", "output_schema": SUMMARY},
        ],
    }  # fmt: skip
    return pipeline_from_table(table, origin="gated")


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig(stuck_after_s=60))
    yield Conductor(store, dispatcher)
    dispatcher.close()


def parked(conductor: Conductor, **gate: Any) -> str:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="c", pipeline=gated(**gate))
    conductor.begin(run_id, "plan", owner="w:1:t", lease_s=30, max_interrupted=3)
    conductor.complete(run_id, "plan", StageResult(PROPOSED, StageFigures()), owner="w:1:t")
    return run_id


def acts(client: redis.Redis) -> list[str]:
    return queued_task_ids(client, "baton.gated.act")


def test_a_gated_stage_parks_its_run_with_nothing_queued(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = parked(conductor)
    # A redelivery of the gated stage (its output is recorded) only tries to advance.
    conductor.complete(run_id, "plan", StageResult(PROPOSED, StageFigures()))
    conductor.advance(run_id, "plan")

    run = conductor.store.get(run_id)
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert run.stages["plan"].status == StageStatus.DONE
    assert run.stages["act"].status == StageStatus.PENDING
    assert run.gates["plan"].status == GateStatus.PENDING
    assert acts(redis_client) == []
    assert run_id in conductor.store.active()


def test_approving_with_an_edit_queues_the_next_stage_once_and_it_reads_the_edit(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = parked(conductor)

    assert conductor.approve(run_id, by="ana", edit=EDITED) == Approval(True, "act")
    assert conductor.approve(run_id, by="bob") == Approval(False)
    assert conductor.approve(run_id, "plan", by="bob", edit=PROPOSED) == Approval(False)

    assert acts(redis_client) == [f"{run_id}.act"]
    assert conductor.store.output(run_id, "plan") == EDITED
    assert conductor.store.output(run_id, "plan.proposed") == PROPOSED
    run = conductor.store.get(run_id)
    assert (run.status, run.stages["act"].status) == (RunStatus.QUEUED, StageStatus.QUEUED)
    assert (run.gates["plan"].decided_by, run.gates["plan"].edited) == ("ana", True)
    approvals = [e for e in conductor.store.audit_log(run_id) if e["kind"] == "gate_approved"]
    assert len(approvals) == 1
    assert json.loads(approvals[0]["data"]) == {"gate": "plan", "by": "ana", "edit": EDITED}
    with pytest.raises(RunStateError, match="was approved already"):
        conductor.reject(run_id, by="bob", reason="too late")


def test_an_edit_that_does_not_fit_the_schema_changes_nothing(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = parked(conductor)
    with pytest.raises(PipelineError, match=r"stage plan does not fit .*summary: Field required"):
        conductor.approve(run_id, by="ana", edit={"plan": "x"})
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL
    assert conductor.store.output(run_id, "plan") == PROPOSED


def test_rejecting_ends_the_run_with_the_reason_and_refuses_an_approval(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = parked(conductor)

    assert conductor.reject(run_id, by="ana", reason="wrong file")
    with pytest.raises(RunStateError, match=r"was rejected \(wrong file\); it cannot be approved"):
        conductor.approve(run_id, by="bob")

    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (RunStatus.REJECTED, "plan: rejected by ana: wrong file")
    assert run_id not in conductor.store.active()
    assert acts(redis_client) == []


def test_resuming_a_rejected_run_plans_again_under_a_new_gate(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = parked(conductor)
    conductor.reject(run_id, by="ana", reason="wrong file")

    assert conductor.resume(run_id) == "plan"
    run = conductor.store.get(run_id)
    assert run.gates == {}
    assert "gate:plan" not in redis_client.hkeys(keys.run(run_id))


def test_the_reconciler_fails_a_gate_whose_timeout_fell(conductor: Conductor) -> None:
    run_id = parked(conductor, timeout_s=60)
    opened = conductor.store.get(run_id).gates["plan"].opened_at
    reconciler = Reconciler(conductor, QueueConfig(stuck_after_s=60))

    assert reconciler.sweep(now=opened + 30).gates == {}
    sweep = reconciler.sweep(now=opened + 61)

    assert sweep.gates == {f"{run_id}/plan": "expired"} and sweep.repairs == []
    run = conductor.store.get(run_id)
    assert (run.status, run.gates["plan"].status) == (RunStatus.FAILED, GateStatus.EXPIRED)
    assert run.reason == "plan: gate plan: no decision within 61s"


def test_an_escalating_gate_keeps_waiting_for_a_person(conductor: Conductor) -> None:
    run_id = parked(conductor, timeout_s=60, on_timeout="escalate")
    opened = conductor.store.get(run_id).gates["plan"].opened_at
    reconciler = Reconciler(conductor, QueueConfig(stuck_after_s=60))

    assert reconciler.sweep(now=opened + 61).gates == {f"{run_id}/plan": "escalated"}
    assert reconciler.sweep(now=opened + 600).gates == {}
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL
    assert conductor.approve(run_id, by="ana") == Approval(True, "act")


@pytest.mark.parametrize("order", [("plan", "plan.b2"), ("plan.b2", "plan")])
def test_two_pending_gates_are_approved_in_either_order_and_the_run_goes_on_once(
    conductor: Conductor, redis_client: redis.Redis, order: tuple[str, str]
) -> None:
    run_id = parked(conductor)

    def second_gate(run: RunRecord, _pipe: object) -> None:  # as a parallel branch's would be
        run.gates["plan.b2"] = run.gates["plan"].model_copy()

    conductor.store.transact(run_id, second_gate)
    first, second = order
    with pytest.raises(RunStateError, match=r"has 2 gates awaiting approval \(plan, plan.b2\)"):
        conductor.approve(run_id, by="ana")

    assert conductor.approve(run_id, first, by="ana") == Approval(True, None)
    conductor.advance(run_id, "plan")  # a redelivery meanwhile goes no further either
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL
    assert acts(redis_client) == []
    assert conductor.approve(run_id, second, by="bob") == Approval(True, "act")
    assert conductor.approve(run_id, first, by="ana") == Approval(False)

    run = conductor.store.get(run_id)
    decided = {name: gate.decided_by for name, gate in run.gates.items()}
    assert decided == {first: "ana", second: "bob"}
    assert acts(redis_client) == [f"{run_id}.act"]

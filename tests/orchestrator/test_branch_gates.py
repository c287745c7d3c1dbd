"""A gated fan-out stage against a real Redis: each branch that finishes waits on its own gate,
decided independently and once; the run holds no worker while it waits, and joins once, after
the last decision, whichever it was."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import redis

from orchestrator.core import fanout
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import RunStateError
from orchestrator.core.execution import StageResult, StartAction
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.gates import Approval
from orchestrator.core.models import GateStatus, RunStatus, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

from .test_fanout_conductor import (
    ISSUE,
    LEASE_S,
    PIPELINE,
    REPRODUCE,
    begin,
    fix_result,
    headers,
)


def gated(**gate: object) -> Pipeline:
    """`wide` (test_fanout_conductor) with a gate on its three-branch `fix` stage."""
    stages = [
        {"name": s.name, "instruction": s.instruction, "output_schema": s.output_schema,
         "tools": list(s.tools),
         **({"reproduce": REPRODUCE} if s.name == "reproduce" else {}),
         **({"proof": {"reproduction_from": "reproduce"}, "parallel": 3, "select": "proof",
             "gate": {"approve": "diff", **gate}} if s.name == "fix" else {})}
        for s in PIPELINE.stages
    ]  # fmt: skip
    return Pipeline.model_validate({"name": "gated", "stages": stages})


GATED = gated()
REPRODUCED = StageResult({"test_files": ["t.py"]})


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def three_finished(conductor: Conductor, proofs: dict[str, bool]) -> str:
    """A run of `gated` whose three fix branches ran and finished, with these proofs."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=GATED)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", REPRODUCED, owner="w0")
    for n, (branch, passed) in enumerate(proofs.items(), start=1):
        assert begin(conductor, run_id, branch, f"w{n}").action == StartAction.RUN
        result = fix_result(run_id, branch, passed, 100 * n)
        fanout.complete_branch(conductor, run_id, "fix", branch, result, owner=f"w{n}")
    return run_id


def test_a_finished_branch_waits_on_its_own_gate_while_the_others_run(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=GATED)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", REPRODUCED, owner="w0")
    for n in (1, 2):
        begin(conductor, run_id, f"b{n}", f"w{n}")
    fanout.complete_branch(conductor, run_id, "fix", "b1", fix_result(run_id, "b1", True, 10),
                           owner="w1")  # fmt: skip
    run = conductor.store.get(run_id)
    assert run.gates["fix.b1"].status == GateStatus.PENDING
    assert run.gates["fix.b1"].branch == "b1" and run.gates["fix.b1"].approve == "diff"
    assert run.gates["fix.b1"].output_key == "fix#b1", "what an approver reads: b1's own output"
    assert run.status == RunStatus.RUNNING, "b2 runs and b3 is queued: the run is not parked"
    assert run.stages["fix"].fan_in is not None
    assert run.stages["fix"].fan_in.branches["b1"].status == BranchStatus.AWAITING_APPROVAL
    # A redelivered b1 does not run again.
    assert begin(conductor, run_id, "b1", "w7").action != StartAction.RUN

    fanout.complete_branch(conductor, run_id, "fix", "b2", None, owner="w2", error="boom")
    begin(conductor, run_id, "b3", "w3")
    fanout.complete_branch(conductor, run_id, "fix", "b3", fix_result(run_id, "b3", True, 5),
                           owner="w3")  # fmt: skip
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.AWAITING_APPROVAL, "nothing runs: the run waits on people"
    assert sorted(name for name, g in run.gates.items() if g.status == GateStatus.PENDING) == [
        "fix.b1",
        "fix.b3",
    ]
    assert headers(redis_client, "baton.gated.pr") == []


@pytest.mark.parametrize("order", list(itertools.permutations(["b1", "b2", "b3"])))
def test_three_branch_gates_decided_in_any_order_join_once_with_the_selection(
    conductor: Conductor, redis_client: redis.Redis, order: tuple[str, ...]
) -> None:
    run_id = three_finished(conductor, {"b1": True, "b2": True, "b3": False})
    with pytest.raises(RunStateError, match="has 3 gates awaiting approval"):
        conductor.approve(run_id, by="ana")
    decisions = {"b1": "reject", "b2": "approve", "b3": "approve"}
    for n, branch in enumerate(order, start=1):
        assert headers(redis_client, "baton.gated.pr") == [], "no join before the last decision"
        gate = f"fix.{branch}"
        if decisions[branch] == "approve":
            approval = conductor.approve(run_id, gate, by="ana")
            assert approval.applied and approval.queued == ("pr" if n == 3 else None)
            assert conductor.approve(run_id, gate, by="ana") == Approval(False)  # once
        else:
            assert conductor.reject(run_id, gate, by="bob", reason="touches the CI config")
            assert not conductor.reject(run_id, gate, by="bob", reason="again")
        run = conductor.store.get(run_id)
        assert run.status == (RunStatus.AWAITING_APPROVAL if n < 3 else RunStatus.QUEUED)

    run = conductor.store.get(run_id)
    fan = run.stages["fix"].fan_in
    assert fan is not None and fan.selected == "b2", "b1 was rejected; b3's proof failed"
    assert fan.branches["b1"].error == "rejected by bob: touches the CI config"
    assert run.stages["fix"].status == StageStatus.DONE
    assert conductor.store.output(run_id, "fix") == conductor.store.output(run_id, "fix#b2")
    assert headers(redis_client, "baton.gated.pr") == [(f"{run_id}.pr", "baton.gated.pr")]


def test_rejecting_every_branch_fails_the_stage_naming_each_reason(conductor: Conductor) -> None:
    run_id = three_finished(conductor, {"b1": True, "b2": True, "b3": True})
    for branch in ("b3", "b1", "b2"):
        conductor.reject(run_id, f"fix.{branch}", by="ana", reason=f"no {branch}")
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason == (
        "fix: no branch finished: b1: rejected by ana: no b1; b2: rejected by ana: no b2; "
        "b3: rejected by ana: no b3"
    )


def test_an_expired_branch_gate_fails_that_branch_only(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=gated(timeout_s=60))
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", REPRODUCED, owner="w0")
    for n in (1, 2, 3):
        begin(conductor, run_id, f"b{n}", f"w{n}")
        result = fix_result(run_id, f"b{n}", True, 10 * n)
        fanout.complete_branch(conductor, run_id, "fix", f"b{n}", result, owner=f"w{n}")
    conductor.approve(run_id, "fix.b2", by="ana")
    conductor.approve(run_id, "fix.b3", by="ana")
    later = conductor.store.get(run_id).gates["fix.b1"].opened_at + 61
    assert conductor.time_out_gates(run_id, later) == {"fix.b1": "expired"}
    run = conductor.store.get(run_id)
    fan = run.stages["fix"].fan_in
    assert fan is not None and fan.selected == "b2"
    assert fan.branches["b1"].error == "gate fix.b1: no decision within 61s"
    assert run.stages["pr"].status == StageStatus.QUEUED


def test_a_branch_gate_times_out_while_its_siblings_still_run(conductor: Conductor) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=gated(timeout_s=60))
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", REPRODUCED, owner="w0")
    for n in (1, 2):
        begin(conductor, run_id, f"b{n}", f"w{n}", lease_s=3600)
    fanout.complete_branch(conductor, run_id, "fix", "b1", fix_result(run_id, "b1", True, 10),
                           owner="w1")  # fmt: skip
    assert conductor.store.get(run_id).status == RunStatus.RUNNING  # b2 runs, b3 is queued
    later = conductor.store.get(run_id).gates["fix.b1"].opened_at + 61
    sweep = Reconciler(conductor, QueueConfig()).sweep(now=later)
    assert sweep.gates == {f"{run_id}/fix.b1": "expired"}
    run = conductor.store.get(run_id)
    fan = run.stages["fix"].fan_in
    assert fan is not None and fan.branches["b1"].status == BranchStatus.FAILED
    assert run.status == RunStatus.RUNNING, "the stage goes on with b2 and b3"

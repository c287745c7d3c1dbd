"""A fan-out stage's transitions against a real Redis: its branches' messages on the real stage
queue, each branch claimed and ended in the run's transaction, one join, one next stage."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from orchestrator.core import fanout
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import (
    Completion,
    Hold,
    StageFigures,
    StageResult,
    StartAction,
)
from orchestrator.core.fanin import BranchStatus
from orchestrator.core.models import ArtifactRef, Issue, IssueSource, RunStatus, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

ISSUE = Issue(source=IssueSource.TEXT, title="Totals are off by one", body="boom")
SCHEMAS = "orchestrator.pipelines.fixer.schemas"
REPRODUCE = {"command_from": "test_command", "test_files_from": "test_files",
             "expected_failure_from": "expected_failure"}  # fmt: skip
WIDE: dict[str, Any] = (
    {"name": "wide", "stages": [
        {"name": "reproduce", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Reproduction",
         "tools": ["read_file", "edit_file"], "reproduce": REPRODUCE},
        {"name": "fix", "instruction": "{reproduce}", "output_schema": f"{SCHEMAS}:Fix",
         "tools": ["read_file", "edit_file"], "proof": {"reproduction_from": "reproduce"},
         "parallel": 3, "select": "proof"},
        {"name": "pr", "instruction": "{fix}", "output_schema": f"{SCHEMAS}:Plan"},
    ]}
)  # fmt: skip
PIPELINE = Pipeline.model_validate(WIDE)
LEASE_S = 30.0


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def headers(client: redis.Redis, queue: str) -> list[tuple[str, str]]:
    """The task id and the name Flower shows of each message on `queue`, oldest first."""
    messages = [json.loads(raw)["headers"] for raw in client.lrange(queue, 0, -1)][::-1]
    return [(message["id"], message["shadow"]) for message in messages]


def fix_result(run_id: str, summary: str, passed: bool, diff_bytes: int) -> StageResult:
    """A fix branch's output whose measured proof `passed`, with a diff of `diff_bytes`."""
    output = {
        "summary": summary,
        "files_changed": ["a.py"],
        "test_command": "pytest",
        "tests_passed": passed,
        "proof": {"passed": passed, "reason": "measured", "reproducing_command": "pytest"},
    }
    diff = ArtifactRef(run_id=run_id, name=f"fix/{summary}/workspace.diff", size_bytes=diff_bytes,
                       sha256=summary)  # fmt: skip
    return StageResult(output, StageFigures(requests=1, artifacts={"workspace.diff": diff}))


def fanned_out(conductor: Conductor) -> str:
    """A run of `wide` whose `reproduce` stage is recorded: `fix` fans out."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", StageResult({"test_files": ["t.py"]}), owner="w0")
    return run_id


def begin(conductor: Conductor, run_id: str, branch: str, owner: str, lease_s: float = LEASE_S):
    return fanout.begin_branch(conductor, run_id, "fix", branch, owner=owner, lease_s=lease_s,
                               max_interrupted=3)  # fmt: skip


def test_a_parallel_stage_sends_one_named_task_per_branch(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    assert headers(redis_client, "baton.wide.fix") == [
        (f"{run_id}.fix.b{n}", f"baton.wide.fix.b{n}") for n in (1, 2, 3)
    ]
    record = conductor.store.get(run_id).stages["fix"]
    assert record.status == StageStatus.QUEUED and record.fan_in is not None
    assert [b.status for b in record.fan_in.branches.values()] == [BranchStatus.QUEUED] * 3


def test_the_branch_whose_proof_passed_with_the_smaller_diff_becomes_the_output_once(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    for n in (1, 2, 3):
        assert begin(conductor, run_id, f"b{n}", f"w{n}").action == StartAction.RUN
    assert begin(conductor, run_id, "b2", "w9").action == StartAction.BUSY  # a duplicate
    ends = {"b1": fix_result(run_id, "one", False, 10), "b2": fix_result(run_id, "two", True, 900),
            "b3": fix_result(run_id, "three", True, 300)}  # fmt: skip
    for branch in ("b2", "b1", "b2", "b3", "b3", "b1"):  # with redeliveries
        owner = f"w{branch[1]}"
        done = fanout.complete_branch(conductor, run_id, "fix", branch, ends[branch], owner=owner)
        assert done == Completion.RECORDED
    run = conductor.store.get(run_id)
    assert run.stages["fix"].status == StageStatus.DONE
    assert run.stages["fix"].fan_in is not None and run.stages["fix"].fan_in.selected == "b3"
    assert conductor.store.output(run_id, "fix") == ends["b3"].output
    assert conductor.store.output(run_id, "fix#b2") == ends["b2"].output
    assert run.stages["fix"].artifacts == ends["b3"].figures.artifacts  # the pr applies b3's diff
    assert (run.current_stage, run.stages["pr"].status) == ("pr", StageStatus.QUEUED)
    assert headers(redis_client, "baton.wide.pr") == [(f"{run_id}.pr", "baton.wide.pr")]
    joins = [e for e in conductor.store.audit_log(run_id) if e["kind"] == "fan_in_joined"]
    assert len(joins) == 1 and joins[0]["branch"] == "wide.fix.b3"
    sessions = {
        e["session"] for e in conductor.store.audit_log(run_id) if e["kind"] == "branch_begin"
    }
    assert {f"{run_id}:fix:b{n}:1" for n in (1, 2, 3)} <= sessions


def test_when_every_branch_fails_the_stage_and_run_fail_with_each_reason(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    for n in (1, 2, 3):
        begin(conductor, run_id, f"b{n}", f"w{n}")
        fanout.complete_branch(conductor, run_id, "fix", f"b{n}", None, owner=f"w{n}",
                               error=f"proof failed {n}")  # fmt: skip
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason == (
        "fix: no branch finished: b1: proof failed 1; b2: proof failed 2; b3: proof failed 3"
    )
    assert headers(redis_client, "baton.wide.pr") == []


def test_a_branch_whose_worker_died_is_sent_again_and_counted_once(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    begin(conductor, run_id, "b1", "dead", lease_s=0.01)
    begin(conductor, run_id, "b2", "w2")
    redis_client.delete("baton.wide.fix")  # the messages were taken by workers
    time.sleep(0.05)  # the dead worker's lease lapses
    sweep = Reconciler(conductor, QueueConfig()).sweep()
    assert [repair.was for repair in sweep.repairs] == ["branches b1"]
    assert headers(redis_client, "baton.wide.fix") == [(f"{run_id}.fix.b1", "baton.wide.fix.b1")]
    again = Reconciler(conductor, QueueConfig()).sweep()  # its message waits: none more is sent
    assert again.repairs == []
    assert headers(redis_client, "baton.wide.fix") == [(f"{run_id}.fix.b1", "baton.wide.fix.b1")]
    assert begin(conductor, run_id, "b1", "w1").action == StartAction.RUN
    gone = fanout.complete_branch(conductor, run_id, "fix", "b1", fix_result(run_id, "x", True, 5),
                                  owner="dead")  # fmt: skip
    assert gone == Completion.LOST
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None and fan.ended == 0
    assert (fan.branches["b1"].attempts, fan.branches["b1"].interrupted) == (2, 1)
    assert fan.branches["b1"].session_id == f"{run_id}:fix:b1:2"


def test_only_the_owner_of_a_branch_renews_it_and_a_cancel_stops_every_branch(
    conductor: Conductor,
) -> None:
    run_id = fanned_out(conductor)
    begin(conductor, run_id, "b1", "w1")
    renew = fanout.renew_branch
    assert renew(conductor, run_id, "fix", "b1", owner="w1", lease_s=60.0) == Hold.HELD
    assert renew(conductor, run_id, "fix", "b1", owner="w2", lease_s=60.0) == Hold.LOST
    assert fanout.hold_branch(conductor, run_id, "fix", "b2", owner="w1") == Hold.LOST
    conductor.cancel(run_id)
    assert fanout.hold_branch(conductor, run_id, "fix", "b1", owner="w1") == Hold.CANCELLED
    assert begin(conductor, run_id, "b2", "w2").action == StartAction.DROP
    late = fix_result(run_id, "late", True, 1)
    assert fanout.complete_branch(conductor, run_id, "fix", "b1", late, owner="w1") == (
        Completion.CANCELLED
    )
    assert fanout.complete_branch(conductor, run_id, "fix", "b1", late, owner="w1") == (
        Completion.LOST
    )
    assert conductor.store.output(run_id, "fix#b1") is None
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None and (fan.ended, fan.joined) == (0, False)
    assert (fan.branches["b1"].status, fan.branches["b1"].error) == (
        BranchStatus.CANCELLED,
        "stopped: the run was cancelled",
    )


def test_branch_ends_racing_in_threads_join_once(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    for n in (1, 2, 3):
        begin(conductor, run_id, f"b{n}", f"w{n}")
    ends = [(f"b{n}", fix_result(run_id, f"fix {n}", n != 2, 100 * n)) for n in (1, 2, 3)]

    def end(index: int) -> Completion:
        branch, result = ends[index % 3]
        return fanout.complete_branch(
            conductor, run_id, "fix", branch, result, owner=f"w{branch[1]}"
        )

    with ThreadPoolExecutor(max_workers=8) as pool:  # each branch ended four times at once
        assert set(pool.map(end, range(12))) == {Completion.RECORDED}
    joins = [e for e in conductor.store.audit_log(run_id) if e["kind"] == "fan_in_joined"]
    assert [e["branch"] for e in joins] == ["wide.fix.b1"]
    assert headers(redis_client, "baton.wide.pr") == [(f"{run_id}.pr", "baton.wide.pr")]
    assert conductor.store.output(run_id, "fix") == ends[0][1].output


def test_a_resumed_run_fans_out_again_with_fresh_sessions(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = fanned_out(conductor)
    for n in (1, 2, 3):
        begin(conductor, run_id, f"b{n}", f"w{n}")
        fanout.complete_branch(conductor, run_id, "fix", f"b{n}", None, owner=f"w{n}", error="no")
    redis_client.delete("baton.wide.fix")
    assert conductor.resume(run_id) == "fix"
    assert headers(redis_client, "baton.wide.fix") == [
        (f"{run_id}.fix.b{n}", f"baton.wide.fix.b{n}") for n in (1, 2, 3)
    ]
    assert begin(conductor, run_id, "b2", "w4").action == StartAction.RUN
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None and (fan.ended, fan.joined) == (0, False)
    assert fan.branches["b2"].session_id == f"{run_id}:fix:b2:2"


def test_a_gated_fan_out_stage_gates_each_finished_branch_and_joins_once_all_are_decided(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    table = copy.deepcopy(WIDE)
    table["stages"][1]["gate"] = {"approve": "diff"}
    gated = Pipeline.model_validate(table)
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=gated)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", StageResult({"test_files": ["t.py"]}), owner="w0")
    for n in (1, 2):
        begin(conductor, run_id, f"b{n}", f"w{n}")
        ended = fix_result(run_id, f"f{n}", True, 100 * n)
        fanout.complete_branch(conductor, run_id, "fix", f"b{n}", ended, owner=f"w{n}")
    begin(conductor, run_id, "b3", "w3")
    fanout.complete_branch(conductor, run_id, "fix", "b3", None, owner="w3", error="no")

    parked = conductor.store.get(run_id)
    assert parked.status == RunStatus.AWAITING_APPROVAL
    assert sorted(parked.gates) == ["fix.b1", "fix.b2"]  # the finished ones, each its own
    assert parked.gates["fix.b1"].artifacts == ["workspace.diff"]
    assert headers(redis_client, "baton.wide.pr") == []
    assert conductor.approve(run_id, "fix.b2", by="ana").queued is None
    assert conductor.approve(run_id, "fix.b1", by="ana").queued == "pr"
    fan = conductor.store.get(run_id).stages["fix"].fan_in
    assert fan is not None and fan.selected == "b1"  # the smaller diff, both proven
    assert "fix" not in conductor.store.get(run_id).gates, "no second gate at the join"
    assert headers(redis_client, "baton.wide.pr") == [(f"{run_id}.pr", "baton.wide.pr")]


def judged_pipeline() -> Pipeline:
    """`wide`, its fix judged by `pick` (the stage right after), then `pr`."""
    table = copy.deepcopy(WIDE)
    table["stages"][1]["select"] = {"judge": "pick", "field": "branch"}
    pick = {"name": "pick", "instruction": "Keep the best of {fix}",
            "output_schema": "tests.orchestrator.test_fanout_spec:Pick"}  # fmt: skip
    table["stages"].insert(2, pick)
    return Pipeline.model_validate(table)


def judge(conductor: Conductor, run_id: str, keep: str) -> None:
    conductor.begin(run_id, "pick", owner="j", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "pick", StageResult({"branch": keep, "why": "smaller"}), owner="j")


def ended_for_a_judge(conductor: Conductor) -> tuple[str, dict[str, StageResult]]:
    """A run of the judged pipeline whose fix branches ended: b1 and b3 done, b2 failed."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=judged_pipeline())
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", StageResult({"test_files": ["t.py"]}), owner="w0")
    ends = {f"b{n}": fix_result(run_id, f"fix {n}", True, 100 * n) for n in (1, 3)}
    for n in (1, 2, 3):
        branch = f"b{n}"
        begin(conductor, run_id, branch, f"w{n}")
        fanout.complete_branch(conductor, run_id, "fix", branch, ends.get(branch),
                               owner=f"w{n}", error="no change")  # fmt: skip
    return run_id, ends


def test_a_judge_reads_the_finished_branches_by_id_and_its_choice_becomes_the_output(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, ends = ended_for_a_judge(conductor)
    assert conductor.store.output(run_id, "fix") == {b: ends[b].output for b in ("b1", "b3")}
    assert headers(redis_client, "baton.wide.pick") == [(f"{run_id}.pick", "baton.wide.pick")]

    judge(conductor, run_id, "b3")

    run = conductor.store.get(run_id)
    assert conductor.store.output(run_id, "fix") == ends["b3"].output
    assert run.stages["fix"].artifacts == ends["b3"].figures.artifacts  # the pr applies b3's
    assert run.stages["fix"].fan_in is not None and run.stages["fix"].fan_in.selected == "b3"
    assert (run.current_stage, run.stages["pr"].status) == ("pr", StageStatus.QUEUED)


def test_a_judge_that_names_no_finished_branch_fails_the_run_saying_what_it_could_choose(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = ended_for_a_judge(conductor)

    judge(conductor, run_id, "b2")

    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (
        RunStatus.FAILED,
        "pick: the judge chose 'b2', which is not a branch that finished; it could choose b1, b3",
    )
    assert headers(redis_client, "baton.wide.pr") == []

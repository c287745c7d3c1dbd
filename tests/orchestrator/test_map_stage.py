"""A `map` stage: one branch per item of an upstream list, made when the stage is sent (pure
parts first, then against a real Redis): the branches on the stage's queue, each reading its
item, the gathered output in item order, and a list it cannot fan out over failing the run
saying why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestrator.core import fanout, keys, transitions
from orchestrator.core.branches import MAX_BRANCHES, mapped_items
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import StageResult, StartAction
from orchestrator.core.fanin import BranchStatus, FanIn, fan_out, map_fan, open_fan
from orchestrator.core.mapping import gather
from orchestrator.core.models import Issue, IssueSource, RunStatus, StageRecord, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.reconciler import Reconciler
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore
from workers.inputs import resolve

SCHEMAS = "orchestrator.pipelines.fixer.schemas"
SUMMARY = "orchestrator.pipelines.schemas:Summary"
PIPELINE = Pipeline.model_validate(
    {"name": "spread", "stages": [
        {"name": "search", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Search"},
        {"name": "inspect", "instruction": "Look at {item} ({branch}) for {issue}",
         "output_schema": SUMMARY, "map": "search.locations"},
        {"name": "report", "instruction": "{inspect}", "output_schema": SUMMARY},
    ]}
)  # fmt: skip
INSPECT = PIPELINE.stage("inspect")
ISSUE = Issue(source=IssueSource.TEXT, title="Totals are off by one", body="boom")


def location(path: str) -> dict[str, Any]:
    return {"path": path, "line_start": 1, "line_end": 2, "why": f"{path} adds"}


def test_the_items_are_the_upstream_list_and_a_bad_list_is_refused_saying_why() -> None:
    two = [location("a.py"), location("b.py")]
    assert mapped_items(INSPECT, {"locations": two}) == two
    for upstream, said in [
        (None, "search.locations is not a list the run has"),
        ({"locations": "a.py"}, "search.locations is not a list the run has"),
        ({"locations": []}, "search.locations is empty: there is nothing to map over"),
        ({"locations": [location("x")] * (MAX_BRANCHES + 1)},
         f"search.locations has {MAX_BRANCHES + 1} items; a stage runs at most {MAX_BRANCHES}"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=said):
            mapped_items(INSPECT, upstream)


def test_a_map_stage_is_queued_without_branches_until_its_list_is_read() -> None:
    record = StageRecord()
    previous = fan_out(2)
    previous.branches["b2"].attempts = 3
    open_fan(record, INSPECT, previous)
    assert record.fan_in is not None and record.fan_in.branches == {}
    made = map_fan(record.fan_in, ["x", "y", "z"])
    assert [(b.item, b.attempts) for b in made.branches.values()] == [(0, 0), (1, 3), (2, 0)]


def test_a_gathered_output_is_in_item_order_and_a_failed_item_fails_it() -> None:
    fan = map_fan(FanIn(), ["x", "y"])
    for branch in fan.branches.values():
        branch.status = BranchStatus.DONE
    outputs = {"b1": '{"summary":"x"}', "b2": '{"summary":"y"}'}
    chosen, error = gather(fan, outputs.__getitem__)
    assert (json.loads(chosen or ""), error) == ({"items": [{"summary": "x"}, {"summary": "y"}]},
                                                 None)  # fmt: skip
    fan.branches["b2"].status, fan.branches["b2"].error = BranchStatus.FAILED, "model gave up"
    assert gather(fan, outputs.__getitem__) == (
        None,
        "1 of 2 items failed: b2 (item 1): model gave up",
    )


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def searched(conductor: Conductor, locations: list[dict[str, Any]]) -> str:
    """A run of `spread` whose search found `locations`: `inspect` is queued and sent."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE)
    conductor.begin(run_id, "search", owner="w0", lease_s=30.0, max_interrupted=3)
    found = {"root_cause": "off by one", "locations": locations}
    conductor.complete(run_id, "search", StageResult(found), owner="w0")
    return run_id


def task_ids(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)][::-1]


def test_one_branch_per_item_each_reading_its_own_and_the_outputs_gathered_in_order(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = searched(conductor, [location("a.py"), location("b.py")])
    assert task_ids(redis_client, "baton.spread.inspect") == [f"{run_id}.inspect.b1",
                                                              f"{run_id}.inspect.b2"]  # fmt: skip
    for name in ("b2", "b1"):
        start = fanout.begin_branch(conductor, run_id, "inspect", name, owner=name, lease_s=30.0,
                                    max_interrupted=3)  # fmt: skip
        assert start.action == StartAction.RUN and start.run is not None
        inputs = resolve(start.run, PIPELINE, INSPECT, start.attempt, conductor.store, branch=name)
        path = "a.py" if name == "b1" else "b.py"
        assert (inputs.state["item"], inputs.state["branch"]) == (location(path), name)
        fanout.complete_branch(conductor, run_id, "inspect", name,
                               StageResult({"summary": f"{path} is fine"}), owner=name)  # fmt: skip

    run = conductor.store.get(run_id)
    assert run.stages["inspect"].status == StageStatus.DONE
    assert conductor.store.output(run_id, "inspect") == {
        "items": [{"summary": "a.py is fine"}, {"summary": "b.py is fine"}]
    }
    assert (run.current_stage, run.stages["report"].status) == ("report", StageStatus.QUEUED)
    assert [e["kind"] for e in conductor.store.audit_log(run_id)].count("map_opened") == 1


@pytest.mark.parametrize(
    ("locations", "said"),
    [([], "search.locations is empty: there is nothing to map over"),
     ([location("x")] * 11, "search.locations has 11 items; a stage runs at most 10 branches")],
)  # fmt: skip
def test_a_list_it_cannot_fan_out_over_fails_the_run_saying_why(
    conductor: Conductor, redis_client: redis.Redis, locations: list[Any], said: str
) -> None:
    run_id = searched(conductor, locations)
    run = conductor.store.get(run_id)
    assert (run.status, run.reason) == (RunStatus.FAILED, f"inspect: cannot fan out: {said}")
    assert task_ids(redis_client, "baton.spread.inspect") == []


@pytest.mark.parametrize(("handoffs", "sent"), [(3, 3), (2, 0)])
def test_each_item_s_branch_is_a_handoff_of_the_run_s_budget(
    conductor: Conductor, redis_client: redis.Redis, handoffs: int, sent: int
) -> None:
    """search → inspect is one hand-off, made with the stage; its three branches add two."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE,
                                 budget=RunBudget(handoffs=handoffs))  # fmt: skip
    conductor.begin(run_id, "search", owner="w0", lease_s=30.0, max_interrupted=3)
    found = {"root_cause": "off by one", "locations": [location(p) for p in "abc"]}
    conductor.complete(run_id, "search", StageResult(found), owner="w0")
    assert len(task_ids(redis_client, "baton.spread.inspect")) == sent
    run = conductor.store.get(run_id)
    if sent:
        assert run.status != RunStatus.FAILED
    else:
        assert run.reason == (
            "inspect: run budget exceeded: handoffs: 1 made + 2 for the branches of inspect, "
            "limit 2"
        )


def test_a_map_whose_sender_was_lost_before_it_read_the_list_is_sent_by_the_reconciler(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE)
    conductor.begin(run_id, "search", owner="w0", lease_s=30.0, max_interrupted=3)
    found = {"root_cause": "off by one", "locations": [location("a.py")]}
    # As if the worker died between recording search (inspect queued) and sending inspect:
    conductor.store.redis.hset(keys.outputs(run_id), "search", json.dumps(found))
    conductor.store.transact(
        run_id, lambda run, _pipe: transitions.decide(run, PIPELINE, "search", found)
    )
    fan = conductor.store.get(run_id).stages["inspect"].fan_in
    assert fan is not None and fan.branches == {}

    sweep = Reconciler(conductor, QueueConfig(stuck_after_s=0.0)).sweep(now=10**10)

    assert [repair.was for repair in sweep.repairs] == ["map not sent"]
    assert task_ids(redis_client, "baton.spread.inspect") == [f"{run_id}.inspect.b1"]

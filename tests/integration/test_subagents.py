"""Subagents on a real Celery worker (`workers.delegate`): a run of two stages on its own worker
subprocess, the fake Gemini server scripting every agent through the real client, Redis real.
The `search` stage delegates to a child, which delegates to a grandchild (depth 2), whose own
delegation (depth 3) is refused; it also starts a kept child, which the later `plan` stage asks
again. What each agent saw is read from the fake server's request log, where their events went
from the run's audit log in Redis, and how `baton log` shows them from the CLI."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator.control.cli import main
from orchestrator.core import keys
from orchestrator.core.children import ChildStore, KeptSession
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

from .conftest import Stack, demo_scenario, stack_settings

NOTE_MARKER = "NOTE-ONLY-CHILDREN-READ"
"""In the host tool's result, which only children read: never in a stage's requests."""
TOOLS = f'''
def read_note(path: str) -> dict:
    """The maintainers' note on a file of the repository.

    Args:
        path: File, relative to the repository root.
    """
    return {{"path": path, "note": "{NOTE_MARKER}: totals are in cents"}}
'''
PIPELINE = """
name = "fixer-plus"

[tools.read_note]
kind = "host"
function = "subagent_kit:read_note"

[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "read_note"]
instruction = "Find the root cause of: {issue}"
delegate = { max_depth = 2, tools = ["read_note", "delegate"], budget = { max_model_calls = 4 } }

[[stages]]
name = "plan"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate"]
instruction = "Plan the fix of: {issue}"
delegate = { tools = [] }
"""
LINE_12 = {"path": "shop/cart.py", "line": 12}
GRANDCHILD = {"summary": "line 12 divides by 100 again",
              "findings": [{"note": "second division", **LINE_12}]}  # fmt: skip
CHILD = {"summary": "cents divided twice", "findings": [{"note": "see line 12", **LINE_12}]}
LEDGER_1 = {"summary": "the ledger rounds half up", "findings": []}
LEDGER_2 = {"summary": "fix it in shop/cart.py, not in the ledger", "findings": []}
OUTPUT = {"summary": "root cause in shop/cart.py line 12"}
PLAN = {"summary": "remove the second division"}


def delegate(goal: str, name: str, **more: Any) -> dict[str, Any]:
    return {"call": {"name": "delegate", "args": {"goal": goal, "name": name, **more}}}


SCRIPT: dict[str, Any] = {
    "search": [
        delegate("Find where cart totals go wrong", "cart", paths=["shop/cart.py"]),
        delegate("How does the ledger round?", "ledger", keep=True),
        {"json": OUTPUT},
    ],
    "sub_cart": [
        {"call": {"name": "read_note", "args": {"path": "shop/cart.py"}}},
        delegate("Check line 12", "line"),
        {"json": CHILD},
    ],
    "sub_line": [delegate("Go deeper", "deep"), {"json": GRANDCHILD}],
    "sub_ledger": [
        {"call": {"name": "read_note", "args": {"path": "shop/ledger.py"}}},
        {"json": LEDGER_1},
        {"json": LEDGER_2},
    ],
    "plan": [delegate("Where should the fix go?", "ledger", keep=True), {"json": PLAN}],
}
REFUSAL = {
    "error": "delegation refused: delegation is limited to depth 2 and this agent is at depth "
    "2: do the work yourself instead of delegating"
}


@dataclass
class Delegated:
    run: RunRecord
    audit: list[dict[str, str]]
    requests: list[dict[str, Any]]
    """The fake server's log of this run's model requests, oldest first."""
    log: str
    """`baton log RUN` as printed."""

    def requests_of(self, agent: str) -> list[dict[str, Any]]:
        return [entry["request"] for entry in self.requests if entry["agent"] == agent]


@pytest.fixture(scope="module")
def delegated(
    redis_url: str, fake_server: FakeGemini, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Delegated]:
    """One run of the pipeline on a worker of its own (only), with the kit on its path."""
    kit = tmp_path_factory.mktemp("subagents")
    stack = Stack(stack_settings(redis_url, fake_server, kit), fake_server, kit)
    (kit / "subagent_kit.py").write_text(TOOLS)
    spec = kit / "fixer-plus.toml"
    spec.write_text(PIPELINE)
    path = os.pathsep.join(filter(None, [str(kit), os.environ.get("PYTHONPATH")]))
    env = {**worker_env(stack.settings), "PYTHONPATH": path}
    stack.fake.set_scenario({"agents": SCRIPT})
    stack.fake.reset()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(kit))  # loading the pipeline checks its tools
        queues = [stage.queue for stage in load_pipeline(str(spec)).stages]
        with services.worker(env, queues, logfile=kit / "worker.log", name="subagents"):
            run = stack.wait(stack.enqueue("Cart total is wrong", stack.sample_repo(),
                                           pipeline=str(spec)), timeout_s=60)  # fmt: skip
    store = RunStore.from_url(stack.settings.require_redis_url())
    try:
        audit = store.audit_log(run.id)
    finally:
        store.redis.close()
    printed = CliRunner(env={"BATON_REDIS_URL": stack.settings.require_redis_url(),
                             "COLUMNS": "160"}).invoke(main, ["log", run.id])  # fmt: skip
    assert printed.exit_code == 0, printed.output
    yield Delegated(run, audit, stack.requests(), printed.output)
    stack.fake.set_scenario(demo_scenario())
    stack.fake.reset()


def test_the_run_is_done_with_a_depth_two_delegation(delegated: Delegated) -> None:
    assert delegated.run.status is RunStatus.DONE, delegated.run.reason
    assert [entry["agent"] for entry in delegated.requests] == [
        "search", "sub_cart", "sub_cart", "sub_line", "sub_line", "sub_cart", "search",
        "sub_ledger", "sub_ledger", "search", "plan", "sub_ledger", "plan",
    ]  # fmt: skip


def test_events_carry_composed_labels_and_derived_session_ids(delegated: Delegated) -> None:
    run = delegated.run.id
    turns = [e for e in delegated.audit if e["kind"] in ("user_message", "model_reply")]

    assert {(e["branch"], e["session"]) for e in turns} == {
        ("fixer-plus.search", f"{run}:search:1"),
        ("fixer-plus.search.sub_cart", f"{run}:search:1:sub:sub_cart:1"),
        ("fixer-plus.search.sub_cart.sub_line", f"{run}:search:1:sub:sub_cart:1:sub:sub_line:1"),
        ("fixer-plus.search.sub_ledger", f"{run}:sub:sub_ledger"),
        ("fixer-plus.plan", f"{run}:plan:1"),
        ("fixer-plus.plan.sub_ledger", f"{run}:sub:sub_ledger"),
    }


def test_a_nested_child_keeps_its_label_on_every_event(delegated: Delegated) -> None:
    grandchild = [e for e in delegated.audit if e.get("session", "").endswith(":sub:sub_line:1")]

    assert [(e["kind"], e["branch"], e["depth"]) for e in grandchild] == [
        ("user_message", "fixer-plus.search.sub_cart.sub_line", "2"),
        ("tool_call", "fixer-plus.search.sub_cart.sub_line", "2"),
        ("tool_result", "fixer-plus.search.sub_cart.sub_line", "2"),
        ("model_reply", "fixer-plus.search.sub_cart.sub_line", "2"),
    ]


def responses(request: dict[str, Any], name: str = "delegate") -> list[dict[str, Any]]:
    return [
        part["functionResponse"]["response"]
        for content in request["contents"]
        for part in content["parts"]
        if part.get("functionResponse", {}).get("name") == name
    ]


def test_a_delegation_at_max_depth_plus_one_is_a_tool_error_the_model_saw(
    delegated: Delegated,
) -> None:
    _, after = delegated.requests_of("sub_line")

    assert responses(after) == [REFUSAL]
    assert not any(".sub_deep" in e.get("branch", "") for e in delegated.audit)


def test_no_child_s_history_enters_its_parent_s_requests_beyond_its_summary(
    delegated: Delegated,
) -> None:
    *_, last_search = delegated.requests_of("search")
    *_, last_child = delegated.requests_of("sub_cart")

    assert responses(last_search) == [CHILD, LEDGER_1]
    assert [c["role"] for c in last_search["contents"]] == ["user", "model", "user", "model",
                                                           "user"]  # fmt: skip
    assert responses(last_child) == [GRANDCHILD]  # the child read its child's summary only
    stages = json.dumps(delegated.requests_of("search") + delegated.requests_of("plan"))
    assert NOTE_MARKER not in stages and "read_note" not in stages.split('"tools"')[0]
    assert "Check line 12" not in stages  # the grandchild's goal stayed in its parent
    assert GRANDCHILD["summary"] not in stages  # and so did its summary
    assert "Go deeper" not in json.dumps(delegated.requests_of("sub_cart"))
    # The negative control: children did read the note, and their requests carry it.
    assert NOTE_MARKER in json.dumps(delegated.requests_of("sub_cart"))


def test_a_kept_child_asked_again_by_a_later_stage_goes_on_with_its_own_history(
    delegated: Delegated,
) -> None:
    *_, from_plan = delegated.requests_of("sub_ledger")

    asked = [p["text"] for c in from_plan["contents"] if c["role"] == "user"
             for p in c["parts"] if "text" in p]  # fmt: skip
    assert asked == ["Your goal: How does the ledger round?", "Your goal: Where should the fix go?"]
    assert NOTE_MARKER in json.dumps(from_plan)  # what it read during search
    assert "Find the root cause" not in json.dumps(from_plan)  # none of the stages' own
    assert responses(delegated.requests_of("plan")[-1]) == [LEDGER_2]


def test_a_kept_child_s_session_is_stored_with_the_run_and_expires_with_it(
    delegated: Delegated, redis_url: str
) -> None:
    run, store = delegated.run.id, RunStore.from_url(redis_url)
    try:
        stored = json.loads(store.redis.get(keys.kept_child(run, "sub_ledger")))
        ttl_s = store.redis.ttl(keys.kept_child(run, "sub_ledger"))
        claimed = store.redis.exists(keys.kept_child_claim(run, "sub_ledger"))
    finally:
        store.redis.close()

    assert stored["delegations"] == 0
    authors = [json.loads(event)["author"] for event in stored["events"]]
    assert authors == ["user", "sub_ledger", "sub_ledger", "sub_ledger", "user", "sub_ledger"]
    assert 0 < ttl_s <= store.ttl_s  # the run ended: its keys expire, this one with them
    assert claimed == 0


def test_baton_log_nests_a_child_s_lines_under_its_stage(delegated: Delegated) -> None:
    lines = delegated.log.splitlines()

    def heads(label: str) -> set[str]:
        return {line.split(" ", 1)[1].split(label)[0] for line in lines if f" {label} " in line}

    assert heads("fixer-plus.search") == {""}
    assert heads("fixer-plus.search.sub_cart") == {"  "}
    assert heads("fixer-plus.search.sub_cart.sub_line") == {"    "}
    assert heads("fixer-plus.plan.sub_ledger") == {"  "}


def test_a_kept_child_is_claimed_by_one_holder_at_a_time_for_a_bounded_time(
    redis_url: str,
) -> None:
    """`ChildStore` on real Redis: a second claim is refused, a release by another holder does
    nothing, the claim lapses by itself, and a stored session reads back as written."""
    client = RunStore.from_url(redis_url).redis
    run = f"claims-{os.getpid()}-{time.monotonic_ns()}"
    store = ChildStore(client, run)
    try:
        assert store.claim("sub_x", "a", ttl_s=30)
        assert not store.claim("sub_x", "b", ttl_s=30)
        store.release("sub_x", "b")
        assert client.get(keys.kept_child_claim(run, "sub_x")) == "a"
        assert 0 < client.ttl(keys.kept_child_claim(run, "sub_x")) <= 30
        store.release("sub_x", "a")
        assert store.claim("sub_x", "b", ttl_s=1)
        time.sleep(1.2)
        assert store.claim("sub_x", "c", ttl_s=30)  # b's claim lapsed

        assert store.load("sub_x") == KeptSession()
        store.save("sub_x", KeptSession(['{"author": "user"}'], 3))
        assert ChildStore(client, run).load("sub_x") == KeptSession(['{"author": "user"}'], 3)
    finally:
        client.delete(keys.kept_child_claim(run, "sub_x"), keys.kept_child(run, "sub_x"))
        client.close()

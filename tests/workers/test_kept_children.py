"""Kept children (`delegate(..., keep=true)`, `workers.delegate`): a child asked for by name and
kept goes on with its own conversation when a later delegation, of the same stage or of a later
stage of the run, addresses it again, under one id derived from the run; a name that cannot be
a label, a kept child without a name and a child another execution is talking to are tool
errors the model reads. Run by `execute_stage` against the in-process fake Gemini through the
real client; the kept sessions in the in-process store (Redis's is the integration tier's)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from google.adk.events import Event
from google.genai import types

from orchestrator.core.pipeline import ISSUE_KEY, load_pipeline
from testkit.inprocess import InProcessGemini
from testkit.sinks import MemoryArtifacts, MemoryChildren
from workers.inputs import StageInputs
from workers.stage import StageSinks, execute_stage
from workers.subsessions import dump_events, load_events

NOTE_MARKER = "NOTE-ONLY-THE-CHILD-READ"
PIPELINE = """
name = "fixer-plus"

[tools.read_note]
kind = "host"
function = "tests.workers.test_delegate:read_note"

[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "read_note"]
delegate = { tools = ["read_note"] }
instruction = "Find the root cause of: {issue}"

[[stages]]
name = "plan"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate"]
delegate = { tools = [] }
instruction = "Plan the fix of: {issue}"

[[stages]]
name = "deep"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate"]
delegate = { tools = ["delegate"], budget = { max_model_calls = 2 } }
instruction = "Dig into: {issue}"
"""
OUTPUT = {"summary": "done"}


def kept(goal: str) -> dict[str, Any]:
    return {"call": {"name": "delegate", "args": {"goal": goal, "name": "cart", "keep": True}}}


def said(n: int) -> dict[str, Any]:
    return {"summary": f"answer {n}", "findings": []}


SCRIPT: dict[str, Any] = {
    "search": [kept("Find the cart code"), kept("And its tests?"), {"json": OUTPUT}],
    "plan": [kept("Where should the fix go?"), {"json": OUTPUT}],
    # One conversation over three calls: its steps go on where the kept history left them.
    "sub_cart": [
        {"call": {"name": "read_note", "args": {"path": "shop/cart.py"}}},
        {"json": said(1)},
        {"json": said(2)},
        {"json": said(3)},
    ],
}


class Run:
    """Stages of one run executed one after the other, sharing the run's kept children."""

    def __init__(
        self, tmp_path: Path, script: dict[str, Any], children: MemoryChildren | None = None
    ) -> None:
        spec = tmp_path / "pipeline.toml"
        spec.write_text(PIPELINE)
        self.pipeline = load_pipeline(str(spec))
        self.fake = InProcessGemini({"agents": script})
        self.children = children
        self.audit: list[dict[str, Any]] = []

    def execute(self, stage: str) -> dict[str, Any]:
        spec = self.pipeline.stage(stage)
        inputs = StageInputs(
            run_id="r1", pipeline=self.pipeline.name, spec=spec, attempt=1, repo="unused",
            commit="0" * 40, state={ISSUE_KEY: "Title: cart total is wrong"},
            tools={n: self.pipeline.tools[n] for n in spec.tools if n in self.pipeline.tools},
        )  # fmt: skip
        sinks = StageSinks(MemoryArtifacts(run_id="r1"), self.audit.extend,
                           children=self.children)  # fmt: skip
        model = self.fake.model(transient_attempts=1)
        return asyncio.run(execute_stage(inputs, model=model, sinks=sinks)).output

    def requests_of(self, agent: str) -> list[dict[str, Any]]:
        return [entry["request"] for entry in self.fake.requests() if entry["agent"] == agent]


def delegate_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part["functionResponse"]["response"]
        for content in request["contents"]
        for part in content["parts"]
        if part.get("functionResponse", {}).get("name") == "delegate"
    ]


def user_texts(request: dict[str, Any]) -> list[str]:
    return [
        part["text"]
        for content in request["contents"]
        if content["role"] == "user"
        for part in content["parts"]
        if "text" in part
    ]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = Run(tmp_path_factory.mktemp("kept"), SCRIPT, MemoryChildren())
    assert run.execute("search") == OUTPUT
    assert run.execute("plan") == OUTPUT
    return run


def test_a_kept_child_goes_on_with_its_own_history_in_a_later_stage(ran: Run) -> None:
    *_, last = ran.requests_of("sub_cart")

    assert user_texts(last) == [
        "Your goal: Find the cart code", "Your goal: And its tests?",
        "Your goal: Where should the fix go?",
    ]  # fmt: skip
    assert NOTE_MARKER in json.dumps(last)  # what it read in the search stage
    assert "Plan the fix" not in json.dumps(last)  # nothing of the stage that asks it
    [answer] = delegate_results(ran.requests_of("plan")[-1])
    assert answer == said(3)


def test_the_stages_read_only_the_kept_child_s_summaries(ran: Run) -> None:
    search = ran.requests_of("search")[-1]

    assert delegate_results(search) == [said(1), said(2)]
    assert NOTE_MARKER not in json.dumps(ran.requests_of("search") + ran.requests_of("plan"))
    assert "Find the cart code" not in json.dumps(ran.requests_of("plan"))


def test_a_kept_child_has_one_run_derived_id_and_the_label_of_whoever_asks_it(ran: Run) -> None:
    children = {(e["branch"], e["session"]) for e in ran.audit if ".sub" in e["branch"]}

    assert children == {
        ("fixer-plus.search.sub_cart", "r1:sub:sub_cart"),
        ("fixer-plus.plan.sub_cart", "r1:sub:sub_cart"),
    }
    # Each call's entries are its own turn only: the restored history is not logged again.
    asked = [e["data"] for e in ran.audit if e["kind"] == "user_message" and ".sub" in e["branch"]]
    assert [json.loads(d)["text"] for d in asked] == [
        "Your goal: Find the cart code", "Your goal: And its tests?",
        "Your goal: Where should the fix go?",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"name": "a.b", "keep": True}, "'a.b' is not"),
        ({"name": "r1:search", "keep": True}, "'r1:search' is not"),
        ({"name": "Cart"}, "'Cart' is not"),
        ({"name": "x" * 29, "keep": True}, "at most 28 characters"),
        ({"keep": True}, "a kept helper needs a name"),
    ],
)
def test_a_bad_name_is_a_tool_error_the_model_reads(
    tmp_path: Path, args: dict[str, Any], error: str
) -> None:
    script = {
        "search": [{"call": {"name": "delegate", "args": {"goal": "Look", **args}}},
                   {"json": OUTPUT}],
    }  # fmt: skip
    run = Run(tmp_path, script, MemoryChildren())

    assert run.execute("search") == OUTPUT
    [refusal] = delegate_results(run.requests_of("search")[-1])
    assert refusal["error"].startswith("delegation refused: ")
    assert error in refusal["error"]
    assert [e["agent"] for e in run.fake.requests()] == ["search", "search"]  # no child ran
    assert run.children is not None and run.children.sessions == {}


def test_a_kept_child_another_execution_holds_is_busy(tmp_path: Path) -> None:
    children = MemoryChildren()
    assert children.claim("sub_cart", "r1:plan:1@elsewhere", 60)
    run = Run(tmp_path, SCRIPT, children)

    run.execute("plan")

    [busy] = delegate_results(run.requests_of("plan")[-1])
    assert busy == {"error": "the helper fixer-plus.plan.sub_cart is busy with another request "
                             "of this run: ask it again later, or ask another helper"}  # fmt: skip
    assert run.requests_of("sub_cart") == []


def test_outside_a_run_no_child_can_be_kept(tmp_path: Path) -> None:
    run = Run(tmp_path, SCRIPT, children=None)

    run.execute("plan")

    [refusal] = delegate_results(run.requests_of("plan")[-1])
    assert refusal == {"error": "delegation refused: this execution has no run to keep a helper "
                                "in; delegate without keep"}  # fmt: skip


def test_a_kept_child_s_own_children_never_get_an_id_twice(tmp_path: Path) -> None:
    """The kept child starts two children a call and never finishes within its 2 model calls:
    its history is not stored, but the count of its delegations is, so the second call's
    children are numbered on."""
    inner = {"call": {"name": "delegate", "args": {"goal": "Look", "name": "inner"}}}
    script = {
        "deep": [kept("Dig"), kept("Dig again"), {"json": OUTPUT}],
        "sub_cart": [inner, inner, {"json": said(1)}],
        "sub_inner": [{"json": said(9)}],
    }
    run = Run(tmp_path, script, MemoryChildren())

    assert run.execute("deep") == OUTPUT

    inner_ids = [e["session"] for e in run.audit
                 if e["branch"].endswith(".sub_inner") and e["kind"] == "user_message"]  # fmt: skip
    assert inner_ids == [f"r1:sub:sub_cart:sub:sub_inner:{n}" for n in (1, 2, 3, 4)]
    assert run.children is not None
    assert (
        run.children.sessions["sub_cart"].events,
        run.children.sessions["sub_cart"].delegations,
    ) == ([], 4)
    out_of_calls = {"error": "the helper fixer-plus.deep.sub_cart used its 2 model calls without "
                             "finishing"}  # fmt: skip
    assert delegate_results(run.requests_of("deep")[-1]) == [out_of_calls, out_of_calls]


def turn(number: int, chars: int) -> list[Event]:
    def content(role: str, text: str) -> types.Content:
        return types.Content(role=role, parts=[types.Part(text=text)])

    return [
        Event(author="user", invocation_id=f"i{number}", content=content("user", f"goal {number}")),
        Event(author="sub_x", invocation_id=f"i{number}", content=content("model", "r" * chars)),
    ]


def test_the_stored_history_drops_its_oldest_turns_past_its_bound() -> None:
    events = turn(1, 500) + turn(2, 500) + turn(3, 500)
    whole = sum(len(e.model_dump_json(exclude_none=True)) for e in events)

    assert load_events(dump_events(events, whole)) == events
    kept = load_events(dump_events(events, whole - 1))
    assert [e.invocation_id for e in kept] == ["i2", "i2", "i3", "i3"]
    # The latest turn stays, whatever its size.
    assert [e.invocation_id for e in load_events(dump_events(events, 10))] == ["i3", "i3"]

"""A stage that delegates (`workers.delegate`), run by `execute_stage` against the in-process
fake Gemini through the real client: the stage's agent delegates to a child, the child to a
grandchild (depth 2), and the grandchild's own delegation, at depth 3, is refused with a tool
error it reads. What each agent saw is read from the fake server's request log; where their
events went, from the audit log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.pipeline import ISSUE_KEY, Pipeline, load_pipeline
from testkit.inprocess import InProcessGemini
from testkit.sinks import MemoryArtifacts
from workers.errors import RunBudgetExceededError
from workers.inputs import StageInputs
from workers.stage import StageSinks, execute_stage

NOTE_MARKER = "NOTE-ONLY-THE-CHILD-READ"
"""In the host tool's result, which only the child reads: never in the stage's requests."""
LINE_12 = {"path": "shop/cart.py", "line": 12}
GRANDCHILD = {"summary": "line 12 divides by 100 again",
              "findings": [{"note": "second division", **LINE_12}]}  # fmt: skip
CHILD_FINAL = {"summary": "cart: {{fn:delegate.summary}}",
               "findings": [{"note": "cents divided twice", **LINE_12}]}  # fmt: skip
CHILD_SUMMARY = {**CHILD_FINAL, "summary": "cart: " + GRANDCHILD["summary"]}
STAGE_OUTPUT = {"summary": "root cause in shop/cart.py line 12"}
SCRIPT: dict[str, Any] = {
    "search": [
        {"call": {"name": "delegate", "args": {
            "goal": "Find where cart totals go wrong", "name": "cart",
            "paths": ["shop/cart.py"]}}},
        {"json": STAGE_OUTPUT},
    ],
    "sub_cart": [
        {"call": {"name": "read_note", "args": {"path": "shop/cart.py"}}},
        {"call": {"name": "delegate", "args": {"goal": "Check line 12", "name": "line"}}},
        {"json": CHILD_FINAL},
    ],
    "sub_line": [
        {"call": {"name": "delegate", "args": {"goal": "Go deeper", "name": "deep"}}},
        {"json": GRANDCHILD},
    ],
}  # fmt: skip
TOOLS = """
name = "fixer-plus"

[tools.read_note]
kind = "host"
function = "tests.workers.test_delegate:read_note"

[tools.held_note]
kind = "host"
function = "tests.workers.test_delegate:held_note"
"""
PIPELINE = (
    TOOLS
    + """
[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "read_note"]
instruction = "Find the root cause of: {issue}"

[stages.delegate]
max_depth = 2
max_children = 2
tools = ["read_note", "delegate"]
budget = { max_model_calls = 4 }
"""
)


def read_note(path: str) -> dict[str, Any]:
    """The maintainers' note on a file of the repository.

    Args:
        path: File, relative to the repository root.
    """
    return {"path": path, "note": f"{NOTE_MARKER}: totals are in cents"}


ACTIVE = {"now": 0, "most": 0}
"""How many `held_note` calls run at once, and the most that ever did."""


async def held_note(path: str) -> dict[str, Any]:
    """The maintainers' note on a file, slowly.

    Args:
        path: File, relative to the repository root.
    """
    ACTIVE["now"] += 1
    ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    await asyncio.sleep(0.05)
    ACTIVE["now"] -= 1
    return {"path": path, "note": "held"}


class Delegated:
    """What one execution of the delegating stage left: output, audit, requests, usage."""

    def __init__(
        self,
        tmp_path: Path,
        pipeline_text: str = PIPELINE,
        script: dict[str, Any] = SCRIPT,
        handoff: Callable[[], None] | None = None,
    ) -> None:
        spec = tmp_path / "pipeline.toml"
        spec.write_text(pipeline_text)
        pipeline: Pipeline = load_pipeline(str(spec))
        stage = pipeline.stage("search")
        inputs = StageInputs(
            run_id="r1", pipeline=pipeline.name, spec=stage, attempt=1, repo="unused",
            commit="0" * 40, state={ISSUE_KEY: "Title: cart total is wrong"},
            tools={name: pipeline.tools[name] for name in stage.tools if name in pipeline.tools},
        )  # fmt: skip
        self.fake = InProcessGemini({"agents": script})
        self.audit: list[dict[str, Any]] = []
        self.sinks = StageSinks(MemoryArtifacts(run_id="r1"), self.audit.extend, requests=[])
        model = self.fake.model(transient_attempts=1)
        self.handoffs = 0

        def counted() -> None:
            self.handoffs += 1
            if handoff is not None:
                handoff()

        self.output = asyncio.run(
            execute_stage(inputs, model=model, sinks=self.sinks, handoff=counted)
        ).output

    def requests_of(self, agent: str) -> list[dict[str, Any]]:
        return [entry["request"] for entry in self.fake.requests() if entry["agent"] == agent]

    def responses(self, request: dict[str, Any], name: str) -> list[dict[str, Any]]:
        """The responses to calls of `name` that `request` sends back to the model."""
        return [
            part["functionResponse"]["response"]
            for content in request["contents"]
            for part in content["parts"]
            if part.get("functionResponse", {}).get("name") == name
        ]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Delegated:
    return Delegated(tmp_path_factory.mktemp("delegate"))


def test_a_depth_two_delegation_returns_the_stage_s_output(ran: Delegated) -> None:
    assert ran.output == STAGE_OUTPUT
    assert [entry["agent"] for entry in ran.fake.requests()] == [
        "search", "sub_cart", "sub_cart", "sub_line", "sub_line", "sub_cart", "search",
    ]  # fmt: skip


def test_the_stage_s_later_request_holds_the_child_s_summary_and_nothing_else_of_it(
    ran: Delegated,
) -> None:
    _, second = ran.requests_of("search")

    assert ran.responses(second, "delegate") == [CHILD_SUMMARY]
    assert [content["role"] for content in second["contents"]] == ["user", "model", "user"]
    stage_sent = json.dumps(ran.requests_of("search"))
    assert NOTE_MARKER not in stage_sent
    assert "read_note" not in json.dumps(second["contents"])
    assert "Check line 12" not in stage_sent  # the grandchild's goal stayed in the child
    # The negative control: the child did read the note, and its requests carry it.
    assert NOTE_MARKER in json.dumps(ran.requests_of("sub_cart"))


def test_a_child_starts_from_its_goal_alone(ran: Delegated) -> None:
    first = ran.requests_of("sub_cart")[0]

    assert [content["role"] for content in first["contents"]] == ["user"]
    [text] = [part["text"] for part in first["contents"][0]["parts"]]
    assert text == "Your goal: Find where cart totals go wrong\nLook first at: shop/cart.py"
    assert "cart total is wrong" not in json.dumps(first)  # not the stage's issue
    declared = [d["name"] for tool in first["tools"] for d in tool["functionDeclarations"]]
    assert sorted(declared) == ["delegate", "read_note"]


def test_a_delegation_past_max_depth_is_a_tool_error_the_model_reads(ran: Delegated) -> None:
    _, after = ran.requests_of("sub_line")

    [refusal] = ran.responses(after, "delegate")
    assert refusal == {
        "error": "delegation refused: delegation is limited to depth 2 and this agent is at "
        "depth 2: do the work yourself instead of delegating"
    }
    assert not any(entry["branch"].endswith(".sub_deep") for entry in ran.audit)


def test_audit_entries_carry_composed_labels_and_derived_session_ids(ran: Delegated) -> None:
    sessions = {(entry["branch"], entry["session"]) for entry in ran.audit}

    assert sessions == {
        ("fixer-plus.search", "r1:search:1"),
        ("fixer-plus.search.sub_cart", "r1:search:1:sub:sub_cart:1"),
        ("fixer-plus.search.sub_cart.sub_line", "r1:search:1:sub:sub_cart:1:sub:sub_line:1"),
    }
    grandchild = [e for e in ran.audit if e["session"].endswith(":sub:sub_line:1")]
    assert [(e["kind"], e["depth"]) for e in grandchild] == [
        ("user_message", "2"), ("tool_call", "2"), ("tool_result", "2"), ("model_reply", "2"),
    ]  # fmt: skip


def test_every_model_call_of_every_child_counts_in_the_stage(ran: Delegated) -> None:
    ledger = ran.fake.requests()

    assert ran.sinks.usage.requests == len(ledger) == 7
    assert ran.sinks.usage.prompt_tokens_total == sum(e["prompt_tokens"] for e in ledger)
    assert ran.sinks.requests is not None
    assert [r["agent"] for r in ran.sinks.requests] == [e["agent"] for e in ledger]


def summary_of(name: str) -> dict[str, Any]:
    return {"summary": f"{name} done", "findings": []}


@pytest.mark.parametrize("max_children", [1, 2])
def test_at_most_max_children_run_at_once_each_in_its_own_session(
    tmp_path: Path, max_children: int
) -> None:
    """Two delegations in one reply: with `max_children = 1` the second waits for the first
    (their tool calls never overlap); with 2 they do, the control that they could."""
    stage = f"""
[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "held_note"]
delegate = {{ max_children = {max_children}, tools = ["held_note"] }}
instruction = "Find it."
"""
    script = {
        "search": [
            {"calls": [{"name": "delegate", "args": {"goal": f"Look at {n}", "name": n}}
                       for n in ("a", "b")]},
            {"json": STAGE_OUTPUT},
        ],
        **{f"sub_{n}": [{"call": {"name": "held_note", "args": {"path": f"{n}.py"}}},
                        {"json": summary_of(n)}] for n in ("a", "b")},
    }  # fmt: skip
    ACTIVE.update(now=0, most=0)

    ran = Delegated(tmp_path, TOOLS + stage, script)

    assert ACTIVE["most"] == max_children
    _, second = ran.requests_of("search")
    assert ran.responses(second, "delegate") == [summary_of("a"), summary_of("b")]
    children = {e["session"] for e in ran.audit if e["branch"] != "fixer-plus.search"}
    assert children == {"r1:search:1:sub:sub_a:1", "r1:search:1:sub:sub_b:2"}


def test_children_take_only_the_model_calls_the_stage_has_left(tmp_path: Path) -> None:
    """A stage of 3 model calls: its first delegation's child may make 2 (its own budget is 4)
    and does not finish in them; its second finds none left and is refused."""
    stage = """
[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "read_note"]
budget = { max_model_calls = 3 }
delegate = { tools = ["read_note"], budget = { max_model_calls = 4 } }
instruction = "Find it."
"""
    script = {
        "search": [
            {"call": {"name": "delegate", "args": {"goal": "Look", "name": "cart"}}},
            {"call": {"name": "delegate", "args": {"goal": "Look again", "name": "cart"}}},
            {"json": STAGE_OUTPUT},
        ],
        "sub_cart": [{"call": {"name": "read_note", "args": {"path": "a.py"}}}],
    }

    ran = Delegated(tmp_path, TOOLS + stage, script)

    assert ran.output == STAGE_OUTPUT
    agents = [entry["agent"] for entry in ran.fake.requests()]
    assert agents == ["search", "sub_cart", "sub_cart", "search", "search"]
    last = ran.requests_of("search")[-1]
    assert ran.responses(last, "delegate") == [
        {"error": "the helper fixer-plus.search.sub_cart used its 2 model calls without finishing"},
        {"error": "delegation refused: the stage has spent its model calls"},
    ]


def test_each_child_started_is_one_handoff_and_a_refused_one_ends_the_stage(
    ran: Delegated, tmp_path: Path
) -> None:
    assert ran.handoffs == 2  # the child and the grandchild; the refused depth-3 one is none

    def refuse() -> None:
        raise RunBudgetExceededError("run budget exceeded: handoffs: 4 made, limit 4")

    with pytest.raises(RunBudgetExceededError, match="handoffs: 4 made, limit 4"):
        Delegated(tmp_path, handoff=refuse)

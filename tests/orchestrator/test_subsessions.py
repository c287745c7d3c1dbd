"""Child sessions' ids, labels and depth (`orchestrator.core.subsessions`), and how the audit
log's reader places a child's entry."""

from __future__ import annotations

import json

import pytest

from orchestrator.control.cli_inspect import transcript_line
from orchestrator.control.inspection import Entry, Part, read_entry
from orchestrator.core.subsessions import (
    DepthError,
    Lineage,
    child_branch,
    child_label,
    child_session_id,
    stable_session_id,
    stage_session,
    stamped,
)

STAGE = Lineage(session="r1:search:1", label="fixer-plus.search", depth=0, max_depth=2)


def test_a_child_session_id_is_parent_sub_branch_invocation() -> None:
    assert child_session_id("r1:search:1", "sub_cart", 3) == "r1:search:1:sub:sub_cart:3"


def test_each_invocation_of_the_same_child_is_its_own_session() -> None:
    ids = [STAGE.child("sub_cart", n).session for n in (1, 2, 3)]

    assert ids == ["r1:search:1:sub:sub_cart:1", "r1:search:1:sub:sub_cart:2",
                   "r1:search:1:sub:sub_cart:3"]  # fmt: skip


def test_a_stably_named_child_has_one_deterministic_id_without_an_invocation() -> None:
    first = stable_session_id("r1:search:1", "indexer")

    assert first == "r1:search:1:sub:indexer"
    assert stable_session_id("r1:search:1", "indexer") == first


def test_a_kept_child_s_id_derives_from_the_run_whichever_stage_asks_it() -> None:
    plan = Lineage(session="r1:plan:2", label="fixer-plus.plan", depth=0, max_depth=2)

    from_search, from_plan = STAGE.kept("sub_cart", "r1"), plan.kept("sub_cart", "r1")

    assert from_search.session == from_plan.session == "r1:sub:sub_cart"
    assert (from_search.label, from_plan.label) == (
        "fixer-plus.search.sub_cart", "fixer-plus.plan.sub_cart",
    )  # fmt: skip
    assert from_search.child("sub_line", 1).session == "r1:sub:sub_cart:sub:sub_line:1"
    with pytest.raises(DepthError):
        from_search.child("sub_line", 1).kept("sub_x", "r1")


def test_a_model_s_name_for_a_child_becomes_its_branch() -> None:
    assert (child_branch("cart"), child_branch("")) == ("sub_cart", "sub")


@pytest.mark.parametrize("given", ["a.b", "a:b", "Cart", "a b", "../x", "x" * 29, "é"])
def test_a_model_s_name_that_could_break_a_label_or_an_id_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="lower-case letters, digits and _") as refused:
        child_branch(given)

    assert repr(given[:40]) in str(refused.value)


def test_a_nested_child_composes_its_label_and_id_from_its_parent() -> None:
    child = STAGE.child("sub_cart", 1)
    grandchild = child.child("sub_line", 2)

    assert (child.label, child.depth) == ("fixer-plus.search.sub_cart", 1)
    assert grandchild.label == "fixer-plus.search.sub_cart.sub_line"
    assert grandchild.session == "r1:search:1:sub:sub_cart:1:sub:sub_line:2"
    assert grandchild.depth == 2


def test_a_delegation_past_max_depth_is_refused() -> None:
    deepest = STAGE.child("sub_a", 1).child("sub_b", 1)

    with pytest.raises(DepthError, match="limited to depth 2"):
        deepest.child("sub_c", 1)


@pytest.mark.parametrize("name", ["a.b", "a:b", "Cart", "", "1x", "x" * 33, "sub-cart"])
def test_a_name_that_could_break_a_label_or_an_id_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="lower-case letters"):
        child_label("fixer-plus.search", name)
    with pytest.raises(ValueError, match="lower-case letters"):
        child_session_id("r1:search:1", name, 1)


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        (None, "p.s.sub"),
        ("p.s.sub", "p.s.sub"),
        ("p.s.sub.sub_x", "p.s.sub.sub_x"),  # a nested child keeps its label
        ("inner", "p.s.sub.inner"),  # a relative branch goes below the child's
        ("p.s.subway", "p.s.sub.p.s.subway"),  # a prefix of a segment is not an ancestor
    ],
)
def test_stamping_keeps_a_label_at_or_below_the_childs(existing: str | None, expected: str) -> None:
    assert stamped("p.s.sub", existing) == expected


def test_a_child_s_entry_is_read_as_its_stage_s_attempt_not_its_invocation() -> None:
    child = Lineage("r1:search:3", "fixer-plus.search", 0, 2).child("sub", 1).child("sub_x", 2)
    data = json.dumps({"content": None})
    raw = {"id": "1-0", "ts": "1.0", "branch": child.label, "session": child.session,
           "stage": "search", "kind": "model_reply", "data": data}  # fmt: skip

    entry = read_entry(raw)

    assert stage_session(child.session) == "r1:search:3"
    assert (entry.stage, entry.attempt) == ("search", 3)
    assert entry.branch == "fixer-plus.search.sub.sub_x"


@pytest.mark.parametrize(("stored", "depth"), [("2", 2), (None, 0), ("x", 0), ("-1", 0), ("99", 4)])
def test_a_child_s_entry_is_read_with_its_depth_bounded(stored: str | None, depth: int) -> None:
    raw = {"id": "1-0", "ts": "1.0", "branch": "p.s.sub", "session": "r1:s:1:sub:sub:1",
           "kind": "event", "data": "{}", **({"depth": stored} if stored else {})}  # fmt: skip

    assert read_entry(raw).depth == depth


def test_baton_log_indents_a_child_s_line_under_its_stage_s() -> None:
    def line(depth: int, branch: str) -> str:
        entry = Entry(id="1-0", ts=0.0, branch=branch, stage="s", attempt=1, kind="model_reply",
                      parts=[Part(kind="text", text="ok")], depth=depth)  # fmt: skip
        return transcript_line(entry, 120).plain.split(" ", 1)[1]

    assert line(0, "p.s").startswith("p.s ")
    assert line(1, "p.s.sub_a").startswith("  p.s.sub_a ")
    assert line(2, "p.s.sub_a.sub_b").startswith("    p.s.sub_a.sub_b ")

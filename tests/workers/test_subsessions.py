"""Child sessions' ids, labels and depth (`workers.subsessions`), and the session service that
stamps a child's label on the events its runner appends."""

from __future__ import annotations

import asyncio

import pytest
from google.adk.events import Event
from google.adk.sessions import InMemorySessionService
from google.genai import types

from workers.subsessions import (
    DepthError,
    LabellingSessionService,
    Lineage,
    child_label,
    child_session_id,
    stable_session_id,
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


def test_the_wrapping_service_stamps_every_appended_event_and_stores_through_its_inner() -> None:
    inner = InMemorySessionService()
    service = LabellingSessionService(inner, "fixer-plus.search.sub")

    async def run() -> list[str | None]:
        session = await service.create_session(app_name="a", user_id="u", session_id="s")
        text = types.Content(role="model", parts=[types.Part(text="hi")])
        for branch in (None, "fixer-plus.search.sub.sub_deep"):
            await service.append_event(
                session, Event(author="sub", invocation_id="i", content=text, branch=branch)
            )
        stored = await inner.get_session(app_name="a", user_id="u", session_id="s")
        assert stored is not None
        return [event.branch for event in stored.events]

    assert asyncio.run(run()) == ["fixer-plus.search.sub", "fixer-plus.search.sub.sub_deep"]

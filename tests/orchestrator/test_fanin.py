"""The fan-in bookkeeping: branches claimed like stages, each end counted once, the join made by
exactly one completion, and the selection by measured facts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.fanin import (
    BranchEnd,
    BranchStatus,
    Claim,
    FanIn,
    Recorded,
    choose,
    claim,
    fan_out,
    lapsed,
    record_end,
    select_by_facts,
    why_none,
)
from orchestrator.core.models import StageRecord
from tests.tiers import examples

LEASE_S = 10.0


def _claim(fan: FanIn, branch: str, owner: str, now: float, max_interrupted: int = 3) -> Claim:
    return claim(fan, branch, run_id="R", stage="fix", owner=owner, now=now, lease_s=LEASE_S,
                 max_interrupted=max_interrupted)  # fmt: skip


def test_a_fan_out_starts_with_every_branch_queued_and_none_ended() -> None:
    fan = fan_out(3)
    assert list(fan.branches) == ["b1", "b2", "b3"]
    assert {record.status for record in fan.branches.values()} == {BranchStatus.QUEUED}
    assert (fan.ended, fan.joined, fan.complete) == (0, False, False)
    assert [record.item for record in fan_out(2, items=True).branches.values()] == [0, 1]


def test_a_claimed_branch_runs_in_its_own_session() -> None:
    fan = fan_out(2)
    assert _claim(fan, "b2", "w1", now=100.0) == Claim.RUN
    record = fan.branches["b2"]
    assert (record.status, record.owner, record.lease_until) == (BranchStatus.RUNNING, "w1", 110.0)
    assert record.session_id == "R:fix:b2:1"
    assert fan.branches["b1"].status == BranchStatus.QUEUED


def test_a_duplicate_delivery_of_a_live_branch_is_busy() -> None:
    fan = fan_out(2)
    _claim(fan, "b1", "w1", now=100.0)
    assert _claim(fan, "b1", "w2", now=105.0) == Claim.BUSY
    assert fan.branches["b1"].owner == "w1"


def test_a_branch_whose_lease_lapsed_runs_again_in_a_fresh_session() -> None:
    fan = fan_out(2)
    _claim(fan, "b1", "w1", now=100.0)
    assert lapsed(fan, now=111.0) == ["b1"]
    assert _claim(fan, "b1", "w2", now=111.0) == Claim.RUN
    record = fan.branches["b1"]
    assert (record.attempts, record.interrupted, record.owner) == (2, 1, "w2")
    assert record.session_id == "R:fix:b1:2"
    assert lapsed(fan, now=111.0) == []


def test_a_branch_lost_too_often_is_exhausted() -> None:
    fan = fan_out(2)
    _claim(fan, "b1", "w1", now=0.0, max_interrupted=2)
    _claim(fan, "b1", "w2", now=20.0, max_interrupted=2)
    assert _claim(fan, "b1", "w3", now=40.0, max_interrupted=2) == Claim.EXHAUSTED


def test_a_late_completion_from_an_execution_that_lost_its_branch_changes_nothing() -> None:
    fan = fan_out(2)
    _claim(fan, "b1", "w1", now=0.0)
    _claim(fan, "b1", "w2", now=20.0)
    assert record_end(fan, BranchEnd("b1", done=True, owner="w1"), now=21.0) == Recorded.LOST
    assert (fan.ended, fan.branches["b1"].status) == (0, BranchStatus.RUNNING)
    assert record_end(fan, BranchEnd("b1", done=True, owner="w2"), now=22.0) == Recorded.COUNTED
    assert _claim(fan, "b1", "w3", now=23.0) == Claim.ENDED


def test_the_last_branch_to_end_joins_once_and_a_redelivery_changes_nothing() -> None:
    fan = fan_out(3)
    ends = [BranchEnd("b2", done=True, proof_passed=True, diff_bytes=300),
            BranchEnd("b1", done=True, proof_passed=False, diff_bytes=10),
            BranchEnd("b3", done=True, proof_passed=True, diff_bytes=200)]  # fmt: skip
    assert [record_end(fan, end, now=1.0) for end in ends] == [
        Recorded.COUNTED,
        Recorded.COUNTED,
        Recorded.JOINED,
    ]
    assert (fan.ended, fan.joined, fan.selected) == (3, True, "b3")
    changed = BranchEnd("b1", done=True, proof_passed=True, diff_bytes=1)
    assert record_end(fan, changed, now=2.0) == Recorded.DUPLICATE
    assert (fan.ended, fan.selected, fan.branches["b1"].proof_passed) == (3, "b3", False)


@pytest.mark.parametrize(
    ("facts", "selected"),
    [
        # (done, proof passed, diff bytes) per branch b1, b2, b3
        ([(True, False, 5), (True, True, 900), (True, True, 800)], "b3"),  # proof, then size
        ([(True, True, 100), (True, True, 100), (True, False, 1)], "b1"),  # a tie: lower number
        ([(True, True, None), (True, True, 700), (False, None, None)], "b2"),  # unknown size last
        ([(False, None, None), (True, False, 50), (True, False, 40)], "b3"),  # none proven
        ([(False, None, None), (False, None, None), (False, None, None)], None),
    ],
)
def test_selection_prefers_a_passing_proof_then_the_smallest_diff(
    facts: list[tuple[bool, bool | None, int | None]], selected: str | None
) -> None:
    fan = fan_out(len(facts))
    for number, (done, passed, size) in enumerate(facts, start=1):
        end = BranchEnd(f"b{number}", done=done, proof_passed=passed, diff_bytes=size,
                        error=None if done else "proof failed")  # fmt: skip
        record_end(fan, end, now=1.0)
    assert fan.selected == selected
    if selected is None:
        assert why_none(fan) == "b1: proof failed; b2: proof failed; b3: proof failed"


def test_a_join_for_a_judge_selects_nothing_until_the_judge_chooses() -> None:
    fan = fan_out(3)
    for branch, done in (("b1", True), ("b2", False), ("b3", True)):
        record_end(fan, BranchEnd(branch, done=done, proof_passed=True), now=1.0, by_facts=False)
    assert (fan.joined, fan.selected) == (True, None)
    with pytest.raises(ValueError, match="the judge chose 'b2', which is not a branch that "
                       "finished; it could choose b1, b3"):  # fmt: skip
        choose(fan, "b2")
    assert choose(fan, "b3") == "b3" and fan.selected == "b3"


def test_a_stage_record_carries_its_fan_in_through_json() -> None:
    record = StageRecord(fan_in=fan_out(2))
    assert record.fan_in is not None
    _claim(record.fan_in, "b1", "w1", now=1.0)
    again = StageRecord.model_validate_json(record.model_dump_json())
    assert again == record and again.fan_in is not None
    assert again.fan_in.branches["b1"].session_id == "R:fix:b1:1"
    assert StageRecord.model_validate_json(StageRecord().model_dump_json()).fan_in is None


FACTS = st.tuples(st.booleans(), st.sampled_from([None, True, False]),
                  st.one_of(st.none(), st.integers(0, 5)))  # fmt: skip


def _expected(facts: list[tuple[bool, bool | None, int | None]]) -> str | None:
    """The rule written out apart from the code: proven first, known sizes before unknown,
    smaller first, lower branch first."""
    done = [(n, passed, size) for n, (ok, passed, size) in enumerate(facts, start=1) if ok]
    for group in ([d for d in done if d[1] is True], done):
        if group:
            known = [d for d in group if d[2] is not None]
            if known:
                smallest = min(size for _, _, size in known)  # type: ignore[type-var]
                return f"b{min(n for n, _, size in known if size == smallest)}"
            return f"b{min(n for n, _, _ in group)}"
    return None


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[list[tuple[bool, bool | None, int | None]], list[int]]:
    """Facts for 2 to 10 branches, and an order of completions that delivers every branch at
    least once and any of them again."""
    facts = draw(st.lists(FACTS, min_size=2, max_size=10))
    extra = draw(st.lists(st.integers(0, len(facts) - 1), max_size=2 * len(facts)))
    order = draw(st.permutations(list(range(len(facts))) + extra))
    return facts, order


@settings(max_examples=examples(300), deadline=None)
@given(_deliveries())
def test_any_order_and_duplication_of_completions_joins_exactly_once(
    case: tuple[list[tuple[bool, bool | None, int | None]], list[int]],
) -> None:
    facts, order = case
    fan = fan_out(len(facts))
    outcomes = []
    for index in order:
        done, passed, size = facts[index]
        end = BranchEnd(f"b{index + 1}", done=done, proof_passed=passed, diff_bytes=size)
        outcomes.append(record_end(fan, end, now=float(len(outcomes))))
        fan = FanIn.model_validate_json(fan.model_dump_json())  # each in its own transaction
    firsts = {order.index(index) for index in range(len(facts))}
    assert outcomes.count(Recorded.JOINED) == 1
    assert outcomes.index(Recorded.JOINED) == max(firsts)
    assert [i for i, o in enumerate(outcomes) if o == Recorded.DUPLICATE] == sorted(
        set(range(len(order))) - firsts
    )
    assert (fan.ended, fan.joined) == (len(facts), True)
    assert fan.selected == _expected(facts) == select_by_facts(fan)

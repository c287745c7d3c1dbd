"""A branch that must wait (a 429, a failure outside it) goes back to its queue on its own, its
siblings untouched; a branch of a cancelled run is stopped without a join; the names a branch
goes by, and where its artifacts go."""

from __future__ import annotations

from orchestrator.core.execution import Held
from orchestrator.core.fanin import (
    BranchEnd,
    BranchStatus,
    Claim,
    FanIn,
    Recorded,
    claim,
    fan_out,
    lapsed,
    postpone,
    record_end,
    stop,
)

LEASE_S = 10.0


def running(count: int = 2, now: float = 100.0) -> FanIn:
    """A fan-out whose every branch `b<n>` is held by `w<n>`."""
    fan = fan_out(count)
    for branch in fan.branches:
        claim(fan, branch, run_id="R", stage="fix", owner=f"w{branch[1]}", now=now,
              lease_s=LEASE_S, max_interrupted=3)  # fmt: skip
    return fan


def test_a_rate_limited_branch_waits_alone_and_counts_its_own_retries() -> None:
    fan = running()
    assert postpone(fan, "b1", owner="w1", now=105.0, delay_s=7.0, reason="429",
                    rate_limited=True)  # fmt: skip
    waiting, sibling = fan.branches["b1"], fan.branches["b2"]
    assert (waiting.status, waiting.waiting_until, waiting.owner) == (
        BranchStatus.WAITING,
        112.0,
        None,
    )
    assert (waiting.rate_limit_retries, waiting.rate_limit_wait_s) == (1, 7.0)
    assert (waiting.infrastructure_retries, waiting.error) == (0, "429")
    assert (sibling.status, sibling.rate_limit_retries) == (BranchStatus.RUNNING, 0)
    assert (fan.ended, fan.joined) == (0, False)


def test_an_infrastructure_failure_counts_against_its_own_budget() -> None:
    fan = running()
    assert postpone(fan, "b2", owner="w2", now=105.0, delay_s=5.0, reason="docker gone",
                    rate_limited=False)  # fmt: skip
    assert (fan.branches["b2"].infrastructure_retries, fan.branches["b2"].rate_limit_retries) == (
        1,
        0,
    )


def test_only_the_execution_holding_a_branch_may_put_it_back() -> None:
    fan = running()
    assert not postpone(fan, "b1", owner="w2", now=105.0, delay_s=7.0, reason="429",
                        rate_limited=True)  # fmt: skip
    assert fan.branches["b1"].status == BranchStatus.RUNNING


def test_a_waiting_branch_runs_again_in_a_fresh_session_and_is_not_interrupted() -> None:
    fan = running()
    postpone(fan, "b1", owner="w1", now=105.0, delay_s=7.0, reason="429", rate_limited=True)
    assert claim(fan, "b1", run_id="R", stage="fix", owner="w9", now=113.0, lease_s=LEASE_S,
                 max_interrupted=3) == Claim.RUN  # fmt: skip
    record = fan.branches["b1"]
    assert (record.attempts, record.interrupted, record.waiting_until) == (2, 0, None)
    assert record.session_id == "R:fix:b1:2"
    assert record.rate_limit_retries == 1  # kept: the retry budget is the branch's, not the try's


def test_the_reconciler_resends_a_branch_whose_retry_message_was_lost() -> None:
    fan = running(3, now=100.0)
    postpone(fan, "b2", owner="w2", now=100.0, delay_s=10.0, reason="429", rate_limited=True)
    late_s = 5.0
    assert lapsed(fan, now=108.0, late_s=late_s) == []  # the leases run to 110
    assert lapsed(fan, now=112.0, late_s=late_s) == ["b1", "b3"]  # b2 is due at 110, late at 115
    assert lapsed(fan, now=116.0, late_s=late_s) == ["b1", "b2", "b3"]


def test_a_branch_of_a_cancelled_run_is_stopped_and_never_joins() -> None:
    fan = running()
    assert stop(fan, "b1", owner="w1", now=120.0)
    assert not stop(fan, "b2", owner="w1", now=120.0)  # not its execution
    assert (fan.branches["b1"].status, fan.branches["b1"].error) == (
        BranchStatus.CANCELLED,
        "stopped: the run was cancelled",
    )
    assert fan.ended == 0 and not BranchStatus.CANCELLED.ended
    assert record_end(fan, BranchEnd("b2", done=True, owner="w2"), now=121.0) == Recorded.COUNTED
    assert not fan.joined


def test_a_failed_branch_keeps_what_it_cost_and_the_size_of_its_diff() -> None:
    fan = running(1)
    end = BranchEnd("b1", done=False, owner="w1", error="not proven", diff_bytes=42, requests=3)
    assert record_end(fan, end, now=130.0) == Recorded.JOINED
    record = fan.branches["b1"]
    assert (record.status, record.error, record.diff_bytes, record.requests) == (
        BranchStatus.FAILED,
        "not proven",
        42,
        3,
    )
    assert fan.selected is None


def test_a_branch_is_named_apart_from_its_stage_and_its_siblings() -> None:
    stage, branch = Held("R", "fix"), Held("R", "fix", "b2")
    assert (stage.session_id(3), branch.session_id(3)) == ("R:fix:3", "R:fix:b2:3")
    assert (stage.label("best3"), branch.label("best3")) == ("best3.fix", "best3.fix.b2")
    assert (stage.folder, branch.folder) == ("fix", "fix/b2")
    assert (str(stage), str(branch)) == ("fix", "fix.b2")

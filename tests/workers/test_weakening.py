"""workers.weakening: by test ids and outcomes, a change that loosens, skips or removes the
tests that hold it to account is refused; a change that makes them pass is not."""

from __future__ import annotations

from workers.outcomes import Outcome, Outcomes
from workers.weakening import weakened

P, F, S = Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED
REPRO = "tests/test_x.py::test_bug"


def _repro(outcome: Outcome | None) -> Outcomes:
    return Outcomes({REPRO: outcome} if outcome else {}, runner="pytest")


def test_a_fix_that_makes_the_reproducing_test_pass_is_not_weakening() -> None:
    suite_before = Outcomes({REPRO: F, "tests/test_y.py::test_ok": P}, runner="pytest")
    suite_after = Outcomes({REPRO: P, "tests/test_y.py::test_ok": P}, runner="pytest")
    assert weakened([REPRO], _repro(F), _repro(P), suite_before, suite_after) is None


def test_a_reproducing_test_loosened_in_the_change_is_weakening() -> None:
    said = weakened([REPRO], _repro(P), _repro(P), None, None)
    skipped = weakened([REPRO], _repro(None), _repro(None), None, None)  # -rA names no skip
    assert (
        said
        == skipped
        == (
            f"the change weakens the tests: {REPRO} failed when the reproduction ran, but with the "
            "change's test files alone they pass, are skipped or do not run: the change alters the "
            "reproducing tests; leave them as the reproduction wrote them and change the code"
        )
    )


def test_a_reproducing_test_skipped_after_the_change_is_weakening() -> None:
    said = weakened([], _repro(F), _repro(S), None, None)
    assert said == (
        f"the change weakens the tests: {REPRO} fail without the change's code, and with it "
        "they are skipped or do not run instead of passing; make them pass"
    )
    assert weakened([], _repro(F), _repro(None), None, None) == said  # gone: the same


def test_a_suite_test_that_ran_and_is_skipped_or_gone_after_is_weakening() -> None:
    before = Outcomes({"a::t1": P, "a::t2": F, "a::t3": P, "a::t4": S}, runner="pytest")
    after = Outcomes({"a::t1": P, "a::t2": S, "a::t4": S}, runner="pytest")
    said = weakened([], _repro(F), _repro(P), before, after)
    assert said == (
        "the change weakens the tests: 2 tests of the suite that ran without the change's code "
        "are skipped or do not run with it: a::t2, a::t3; a fix may not skip, xfail or remove "
        "tests"
    )


def test_a_test_skipped_on_both_sides_or_new_after_is_not_weakening() -> None:
    before = Outcomes({"a::t1": S}, runner="pytest")
    after = Outcomes({"a::t1": S, "a::t2": P}, runner="pytest")
    assert weakened([], _repro(F), _repro(P), before, after) is None

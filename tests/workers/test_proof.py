from __future__ import annotations

import pytest

from orchestrator.schemas import Fix, Plan, TestRun
from workers.proof import counts, describe, evidence, succeeded

UNITTEST_FAIL = """..EE
======================================================================
ERROR: test_average_price_of_empty_cart_is_zero (tests.test_cart.CartTest)
----------------------------------------------------------------------
ZeroDivisionError: integer division or modulo by zero

----------------------------------------------------------------------
Ran 4 tests in 0.001s

FAILED (errors=2)
"""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (UNITTEST_FAIL, (2, 2)),
        ("....\n------\nRan 4 tests in 0.001s\n\nOK\n", (4, 0)),
        ("Ran 5 tests in 0.2s\n\nFAILED (failures=1, errors=1, skipped=1)\n", (2, 2)),
        ("Ran 3 tests in 0.2s\n\nOK (skipped=1)\n", (3, 0)),
        ("===== 2 failed, 3 passed in 0.12s =====", (3, 2)),
        ("3 passed in 0.01s", (3, 0)),
        ("1 failed, 1 passed, 2 errors in 1.00s", (1, 3)),
        ("make: *** [test] Error 2", (None, None)),
    ],
)
def test_counts_come_from_the_runners_summary(
    output: str, expected: tuple[int | None, int | None]
) -> None:
    assert counts(output) == expected


def test_a_run_succeeds_only_with_exit_zero_and_nothing_failed() -> None:
    ok = TestRun(command="t", exit_code=0, passed=4, failed=0)
    assert succeeded(ok)
    assert not succeeded(ok.model_copy(update={"exit_code": 1}))
    assert not succeeded(ok.model_copy(update={"failed": 1}))
    assert not succeeded(
        TestRun(command="t", exit_code=None, passed=None, failed=None, timed_out=True)
    )


def test_description_names_exit_code_and_counts() -> None:
    assert (
        describe(TestRun(command="t", exit_code=1, passed=2, failed=2))
        == "exit code 1, 2 passed, 2 failed"
    )
    assert (
        describe(TestRun(command="t", exit_code=None, passed=None, failed=None, timed_out=True))
        == "timed out"
    )


def test_evidence_names_the_command_and_both_runs() -> None:
    before = {"command": "pytest -q", "exit_code": 1, "passed": 3, "failed": 1, "timed_out": False}
    after = {**before, "exit_code": 0, "passed": 4, "failed": 0}
    assert evidence(Fix, {"tests_before": before, "tests_after": after}) == (
        "Verified by Baton in a sandbox with `pytest -q`:\n"
        "- before the change: exit code 1, 3 passed, 1 failed\n"
        "- after the change: exit code 0, 4 passed, 0 failed"
    )
    assert evidence(Fix, None) == ""
    assert evidence(Fix, {"summary": "no tests"}) == ""
    assert evidence(Plan, {"tests_after": after}) == ""  # a schema that measures no tests

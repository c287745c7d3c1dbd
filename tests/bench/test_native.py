"""The native projects' table, drawn from a hand-written results file: a project whose compiled
module is missing, or that did not build, says so in its row."""

from __future__ import annotations

from bench import native
from bench.docs import Source
from testkit.projects import summary_counts

BUILT = {
    "project": "MarkupSafe", "version": "2.1.5", "kind": "C extension", "built": True,
    "compiled_imports": True, "passed": 53, "failed": 0, "skipped": 0, "skip_reasons": [],
    "by_hand": {"passed": 53, "failed": 0}, 
    "build": ["python setup.py build_ext --inplace"],
}  # fmt: skip
MISSING = {
    **BUILT, "project": "simplejson", "version": "3.19.3", "compiled_imports": False,
    "by_hand": {"passed": 51, "failed": 0},
    "skipped": 2, "skip_reasons": ["_speedups.so is missing!"], 
    "build": [],
}  # fmt: skip
REPEATED = {**BUILT, "project": "PyYAML", "version": "6.0.2", "passed": 2606, "repeated_ids": 2,
            "by_hand": {"passed": 2608, "failed": 0}}  # fmt: skip
"""Two parametrized ids the runner counts twice each: the baseline is still the runner's."""
FAILED = {"project": "frozenlist", "version": "1.5.0", "kind": "Cython", "built": False,
          "error": "setup command 'x' exited with 1"}  # fmt: skip


def _source() -> Source:
    data = {"date": "2026-12-02 11:00", "commit": "abc1234", "took_s": 300,
            "projects": [BUILT, MISSING, REPEATED, FAILED]}  # fmt: skip
    return Source("bench/results/native.json", data)


def test_each_project_row_says_what_its_environment_showed() -> None:
    rows = {
        line.split(" | ")[0].strip("| "): line for line in native.latest(_source()).splitlines()
    }

    assert (
        "| yes | 53 / 0 | 53 / 0 | 0 (none) | `python setup.py build_ext --inplace` |"
        in (rows["MarkupSafe 2.1.5"])
    )
    assert (
        "| NO | 53 / 0 | 51 / 0 | 2 (_speedups.so is missing! — its `TestMissingSpeedups` skips"
        in rows["simplejson 3.19.3"]
    )
    assert "| yes | 2606 / 0 (2 ids repeated) | 2608 / 0 |" in rows["PyYAML 6.0.2"]
    assert "no: setup command 'x' exited with 1" in rows["frozenlist 1.5.0"]


def test_the_history_row_counts_what_held_for_each_project() -> None:
    assert native.row(_source()) == ["4", "3", "2", "2", "2"]


def test_the_by_hand_count_reads_each_runners_own_summary() -> None:
    jest = "PASS test/unit/v4.test.js\nTests:       1 failed, 2 skipped, 46 passed, 49 total\n"
    pytest = "==== 2 failed, 51 passed, 1 skipped in 0.21s ====\n"
    unittest = "Ran 144 tests in 0.1s\n\nOK (skipped=1)\n"

    assert summary_counts(jest) == (46, 1)
    assert summary_counts(pytest) == (51, 2)
    assert summary_counts(unittest) == (143, 0)

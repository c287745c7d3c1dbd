"""The tracer-cost benchmark's figures, its void rule and its docs section, without services: pairs
and results files written by hand, and one pair of runs in local workspaces of the demo's
sample repository (no Docker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import claims, docs, proofcost
from demo.runner import make_sample_repo
from testkit.sandboxes import LocalSandboxes
from tests.repos import Git
from workers.sandboxes import WorkspaceRequest


def pair(untraced_s: float, traced_s: float, *, warmup: bool = False) -> dict[str, Any]:
    return {"warmup": warmup, "first": "untraced", "untraced_s": untraced_s, "traced_s": traced_s}


def test_the_figures_are_medians_of_the_pairs_after_the_warm_up() -> None:
    pairs = [pair(5.0, 9.0, warmup=True), pair(1.0, 1.5), pair(2.0, 2.2), pair(1.2, 2.4)]

    figures = proofcost.summary(pairs)

    # untraced 1.0, 2.0, 1.2; traced 1.5, 2.2, 2.4; extra 0.5, 0.2, 1.2; ratio 1.5, 1.1, 2.0
    assert figures == {"untraced_s": 1.2, "traced_s": 2.2, "extra_s": 0.5, "ratio": 1.5}


def test_the_overall_figures_pool_the_pairs_of_every_instance_that_is_not_void() -> None:
    rows = [
        {"instance": "a", "void": [], "pairs": [pair(9.0, 9.0, warmup=True), pair(1.0, 2.0)]},
        {"instance": "b", "void": [], "pairs": [pair(2.0, 3.0), pair(4.0, 4.4)]},
        {"instance": "c", "void": ["pair 1: a run timed out"], "pairs": [pair(1.0, 100.0)]},
        {"instance": "d", "void": ["it did not run: RuntimeError()"]},
    ]

    found = proofcost.overall(rows)

    # pairs (1, 2), (2, 3), (4, 4.4): extras 1, 1, 0.4; ratios 2, 1.5, 1.1
    assert found == {"instances": 2, "pairs": 3, "untraced_s": 2.0, "traced_s": 3.0,
                     "extra_s": 1.0, "ratio": 1.5}  # fmt: skip


FIX = (
    "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
    "@@ -3,1 +3,1 @@\n-    return 1\n+    return 2\n"
)
"""A fix that touches line 3 of pkg/mod.py."""
F2P = "tests/test_mod.py::test_it"


def timed(
    *, ran: dict[str, set[int]] | None = None, failed: tuple[str, ...] = (F2P,),
    timed_out: bool = False,
) -> proofcost.Timed:  # fmt: skip
    return proofcost.Timed(1.0, list(failed), timed_out, ran)


ON_PATH = {"pkg/mod.py": {1, 2, 3}, "tests/test_mod.py": {1}}


@pytest.mark.parametrize(
    ("untraced", "traced", "reasons"),
    [
        (timed(), timed(ran=ON_PATH), []),
        (timed(), timed(ran=None), ["pair 1: the traced run left no record the proof reads"]),
        (timed(), timed(ran={"pkg/mod.py": {1, 2}}),
         ["pair 1: the traced run ran no line the fix touches"]),
        (timed(), timed(ran=ON_PATH, timed_out=True), ["pair 1: a run timed out"]),
        (timed(failed=()), timed(ran=ON_PATH, failed=()),
         ["pair 1: the FAIL_TO_PASS tests did not all fail"]),
        (timed(), timed(ran=ON_PATH, failed=(F2P, "tests/test_mod.py::test_other")),
         ["pair 1: the runs failed different tests"]),
    ],
    ids=["measured", "no record", "off the fix", "timed out", "nothing failed", "other tests"],
)  # fmt: skip
def test_an_instance_is_void_unless_the_tracer_saw_the_fixed_lines_and_both_runs_agree(
    untraced: proofcost.Timed, traced: proofcost.Timed, reasons: list[str]
) -> None:
    checks = [{False: untraced, True: traced}]

    assert proofcost.void(checks, {"pkg/mod.py": FIX}, [F2P]) == reasons


def test_the_record_tells_whether_the_line_tracer_or_the_profile_hook_saw_the_tests() -> None:
    lines = "L\t/workspace/tests/test_mod.py\t1,2\nF\t/workspace/tests/test_mod.py\t1,2,3\n"
    functions = "L\t/workspace/conftest.py\t1\nF\t/workspace/tests/test_mod.py\t1,2,3\n"

    assert proofcost.tracer_kind(lines, "/workspace", ["tests/test_mod.py"]) == "lines"
    assert proofcost.tracer_kind(functions, "/workspace", ["tests/test_mod.py"]) == (
        "functions called"
    )
    assert proofcost.tracer_kind("", "/workspace", ["tests/test_mod.py"]) == ""


def test_names_that_are_no_file_are_counted_apart_from_the_files_traced() -> None:
    ran = {"pkg/mod.py": {1, 2, 3}, "tests/test_mod.py": {1, 5},
           "<attrs generated __eq__ attr._make.Attribute>": {1, 2}, "<string>": {1}}  # fmt: skip

    assert proofcost.traced_counts(ran) == {
        "files_traced": 2, "lines_traced": 5, "not_files_traced": 2,
    }  # fmt: skip


EMPTY_CART_TEST = """import unittest

from shopcart.cart import Cart


class EmptyCartTest(unittest.TestCase):
    def test_average_of_an_empty_cart_is_zero(self):
        self.assertEqual(Cart().average_price_cents(), 0)
"""


def test_a_pair_of_runs_times_the_reproducing_command_with_and_without_the_tracer(
    tmp_path: Path, git: Git
) -> None:
    remote = make_sample_repo(tmp_path / "shopcart.git")
    request = WorkspaceRequest(repo=str(remote), commit=git("rev-parse", "HEAD", cwd=remote),
                               stage="proofcost")  # fmt: skip
    lines = EMPTY_CART_TEST.splitlines()
    test = ("diff --git a/tests/test_it.py b/tests/test_it.py\nnew file mode 100644\n"
            f"--- /dev/null\n+++ b/tests/test_it.py\n@@ -0,0 +1,{len(lines)} @@\n"
            + "".join(f"+{line}\n" for line in lines))  # fmt: skip
    sandboxes = LocalSandboxes(tmp_path / "cache")
    command = "python -m unittest tests.test_it"

    untraced = proofcost.timed_run(sandboxes, request, test, command, traced=False)
    traced = proofcost.timed_run(sandboxes, request, test, command, traced=True)

    failing = ["tests.test_it.EmptyCartTest.test_average_of_an_empty_cart_is_zero"]
    assert untraced.failed == traced.failed == failing
    assert untraced.seconds > 0 and traced.seconds > 0
    assert untraced.ran is None and untraced.record == ""
    assert traced.ran is not None and "tests/test_it.py" in traced.ran
    assert proofcost.tracer_kind(traced.record, traced.root, ["tests/test_it.py"]) == "lines"


RESULTS: dict[str, Any] = {
    "benchmark": "proofcost",
    "date": "2026-12-02 19:20",
    "commit": "abc1234",
    "took_s": 240,
    "command": "python -m bench proofcost",
    "environment": {"runtime": "runc", "runtime_is_dockerd_default": True, "docker": "20.10.24",
                    "host_cpus": 2, "host": "Linux", "sandbox_image": "baton-sandbox:2"},
    "pairs": 3,
    "warmup_pairs": 1,
    "instances": [
        {"instance": "toolz-1.2.0-interpose-empty", "tracer": "lines", "files_traced": 12,
         "lines_traced": 840, "not_files_traced": 0, "void": [],
         "pairs": [pair(1.0, 2.0, warmup=True), pair(0.8, 1.6), pair(0.9, 1.7), pair(0.7, 1.9)],
         "untraced_s": 0.8, "traced_s": 1.7, "extra_s": 0.8, "ratio": 2.125},
        {"instance": "semver-3.0.4-compare-subclass", "tracer": "functions called",
         "files_traced": 7, "lines_traced": 300, "not_files_traced": 1, "void": [],
         "pairs": [pair(1.0, 1.0, warmup=True), pair(1.25, 1.2), pair(1.25, 1.25),
                   pair(1.25, 1.15)],
         "untraced_s": 1.25, "traced_s": 1.2, "extra_s": -0.05, "ratio": 0.96},
        {"instance": "parse-1.20.2-hyphen-field-name",
         "void": ["pair 2: the traced run left no record the proof reads"]},
    ],
    "overall": {"instances": 2, "pairs": 6, "untraced_s": 1.0, "traced_s": 1.45, "extra_s": 0.35,
                "ratio": 1.5},
}  # fmt: skip


def test_the_section_shows_each_instance_and_all_with_where_the_figures_come_from() -> None:
    source = docs.Source("bench/results/proofcost.json", RESULTS)

    text = proofcost.latest(source)

    assert text.startswith(
        "Latest run (`bench/results/proofcost.json`, commit abc1234, 2026-12-02 19:20; it took "
        "240 s; sandboxes under runc (dockerd's default); per instance 1 warm-up pair left out, "
        "then 3 pairs):"
    )
    lines = text.splitlines()
    assert "| instance | what the proof read | untraced s | traced s | extra s | ratio |" in lines
    assert ("| `toolz-1.2.0-interpose-empty` | lines: 840 lines of 12 files | 0.80 | 1.70 | "
            "+0.80 | 2.12× |") in lines  # fmt: skip
    assert ("| `semver-3.0.4-compare-subclass` | functions called: 300 lines of 7 files (and 1 "
            "names that are no file) | 1.25 | 1.20 | -0.05 | 0.96× |") in lines  # fmt: skip
    assert ("| `parse-1.20.2-hyphen-field-name` | void: pair 2: the traced run left no record "
            "the proof reads |  |  |  |  |") in lines  # fmt: skip
    assert "| **all: 6 pairs of 2 instances** |  | 1.00 | 1.45 | +0.35 | 1.50× |" in lines


def test_every_figure_of_the_section_is_traced_to_the_results_file() -> None:
    source = docs.Source("bench/results/proofcost.json", RESULTS)

    text = proofcost.latest(source)

    assert claims.untraced(text, [source]) == []
    assert claims.untraced(text.replace("| 1.45 |", "| 1.40 |"), [source]) == ["1.40"]

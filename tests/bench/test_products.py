"""The build-products benchmark's pure parts, without Docker: its figures from hand-made timings,
and its sections drawn from a hand-written results file, every figure traced to that file."""

from __future__ import annotations

from typing import Any

from bench import claims, docs, products
from bench.docs import Source
from workers.environments import Environment
from workers.outcomes import Outcomes
from workers.rebuild import BuildRun

ENV = Environment(
    key="k", tag="baton-env:k", spec=products.SPEC, test_command="t", baseline=Outcomes(),
    commit="a" * 40, products=("build/", "src/markupsafe/_speedups.so"),
)  # fmt: skip
PROJECT = products.Project("/repo", "a" * 40, "b" * 40, ENV, build_s=61.2)
HAND_WRITTEN: dict[str, Any] = {
    "benchmark": "products", "date": "2026-12-02 11:40", "commit": "1a2b3c4", "took_s": 240,
    "project": "MarkupSafe 2.1.5", "products": 2, "environment_build_s": 61.2, "rounds": 8,
    "hosts": {
        "runsc": {"overlay": {"open": {"p50_ms": 812.4, "p95_ms": 990.1, "n": 8},
                              "first_test": {"p50_ms": 2210.0, "p95_ms": 2502.6, "n": 8}},
                  "copy-in": {"open": {"p50_ms": 701.3, "p95_ms": 870.8, "n": 8},
                              "first_test": {"p50_ms": 2050.5, "p95_ms": 2311.9, "n": 8}}},
        "runc": {"overlay": {"open": {"p50_ms": 402.0, "p95_ms": 455.5, "n": 8},
                             "first_test": {"p50_ms": 903.3, "p95_ms": 1001.7, "n": 8}},
                 "copy-in": {"open": {"p50_ms": 388.8, "p95_ms": 430.2, "n": 8},
                             "first_test": {"p50_ms": 880.1, "p95_ms": 960.4, "n": 8}}},
    },
    "overlay_over_copy_in": {"runsc": {"p50": 1.16, "p95": 1.14},
                             "runc": {"p50": 1.03, "p95": 1.06}},
    "build_step": {
        "host": "runsc",
        "unchanged": {"p50_ms": 120.4, "p95_ms": 150.9, "n": 4, "builds": 0},
        "one line of C": {"p50_ms": 3400.2, "p95_ms": 3902.7, "n": 4, "builds": 4,
                          "compile": {"p50_ms": 2980.6, "p95_ms": 3410.3, "n": 4}},
    },
    "targets": {"builds on an unchanged tree": {"target": "0", "value": 0, "met": True}},
}  # fmt: skip


def test_the_figures_are_the_medians_of_the_timings_and_the_builds_counted() -> None:
    opened = {
        ("runsc", "overlay"): [(0.8, 2.0), (1.0, 2.2), (0.9, 2.4)],
        ("runsc", "copy-in"): [(0.5, 2.0), (0.4, 2.1), (0.6, 2.3)],
    }
    compiled = BuildRun(("python setup.py build_ext --inplace",), 0, 2.5, "ok")
    steps: dict[str, list[tuple[float, BuildRun | None]]] = {
        "unchanged": [(0.1, None), (0.3, None), (0.2, None)],
        "one line of C": [(3.0, compiled), (3.5, compiled), (4.0, compiled)],
    }

    figures = products.summarize(PROJECT, opened, steps)

    overlay = figures["hosts"]["runsc"]["overlay"]
    assert overlay["open"] == {"p50_ms": 900.0, "p95_ms": 1000.0, "n": 3}
    assert overlay["first_test"]["p50_ms"] == 2200.0
    assert figures["hosts"]["runsc"]["copy-in"]["open"]["p50_ms"] == 500.0
    assert figures["overlay_over_copy_in"]["runsc"] == {"p50": 1.8, "p95": 1.67}
    step = figures["build_step"]
    assert step["unchanged"] == {"p50_ms": 200.0, "p95_ms": 300.0, "n": 3, "builds": 0}
    assert step["one line of C"]["p50_ms"] == 3500.0
    assert step["one line of C"]["compile"] == {"p50_ms": 2500.0, "p95_ms": 2500.0, "n": 3}
    assert (figures["products"], figures["rounds"], figures["environment_build_s"]) == (2, 3, 61.2)
    assert figures["targets"]["builds on an unchanged tree"]["met"] is True


def test_a_build_on_an_unchanged_tree_misses_the_target() -> None:
    built = BuildRun(("make",), 0, 1.0, "ok")
    steps: dict[str, list[tuple[float, BuildRun | None]]] = {
        "unchanged": [(0.1, None), (1.2, built)],
        "one line of C": [(3.0, built)],
    }
    opened = {("runc", "overlay"): [(0.4, 1.0)], ("runc", "copy-in"): [(0.4, 1.0)]}

    target = products.summarize(PROJECT, opened, steps)["targets"]["builds on an unchanged tree"]

    assert (target["value"], target["met"]) == (1, False)


def test_the_latest_section_shows_the_hand_written_figures_and_only_them() -> None:
    source = Source("bench/results/products.json", HAND_WRITTEN)

    body = products.latest(source)

    assert body.startswith(
        "Latest run (`bench/results/products.json`, commit 1a2b3c4, 2026-12-02 11:40; it took "
        "240 s; MarkupSafe 2.1.5, 2 build products kept, its environment built in 61 s):"
    )
    assert "| **runsc** | build overlay | 8 | 812 | 990 | 2210 | 2503 |" in body
    assert "| **runc** | copy-in (before) | 8 | 389 | 430 | 880 | 960 |" in body
    ratios = "1.16× at p50 and 1.14× at p95 under runsc; 1.03× at p50 and 1.06× at p95 under runc"
    assert ratios in body
    assert "| unchanged (the check alone) | 4 | 0 | 120 | 151 |" in body
    assert "| one line of `_speedups.c` changed | 4 | 4 | 3400 | 3903 |" in body
    assert "| … of which the build command | 4 |  | 2981 | 3410 |" in body
    assert "| builds on an unchanged tree | 0 (target 0) | yes |" in body
    assert claims.untraced(body, [source]) == []


def test_the_history_has_a_row_per_run_in_its_columns() -> None:
    older = {**HAND_WRITTEN, "date": "2026-12-01 09:00", "commit": "0f0f0f0"}
    sources = [Source("bench/results/history/products.jsonl", r) for r in (older, HAND_WRITTEN)]

    drawn = docs.history_table(products, sources)

    lines = drawn.splitlines()
    assert lines[0].count("|") == len(products.HISTORY) + 3  # date, commit and the columns
    assert lines[2:] == [
        "| 2026-12-01 09:00 | 0f0f0f0 | 812 | 701 | 402 | 389 | 120 | 3400 |",
        "| 2026-12-02 11:40 | 1a2b3c4 | 812 | 701 | 402 | 389 | 120 | 3400 |",
    ]
    assert claims.untraced(drawn, sources) == []


def test_the_rounds_rotate_through_every_order() -> None:
    jobs = ["a", "b", "c"]

    assert [products.rotated(jobs, n) for n in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip

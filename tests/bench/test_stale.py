"""`bench.stale` and the stamps it reads (`bench.record.commit`, `evaluation.report.source_commit`,
the refusal of `python -m bench`), on repositories built here: code under `src/`, results under
`results/`, notes under `docs/`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import record, stale
from evaluation import report
from orchestrator.core.git import code_digest
from tests.repos import Git, Upstream

CODE = ("src/",)
RESULTS = "results/probe.json"


def _record(upstream: Upstream, git: Git, commit: str) -> None:
    """Commit a results file stamped `commit` (a commit that touches no code)."""
    upstream.commit({RESULTS: json.dumps({"commit": commit, "p50_ms": 1.5})}, "results")


def _short(git: Git, upstream: Upstream, rev: str = "HEAD") -> str:
    return git("rev-parse", "--short", rev, cwd=upstream.work)


@pytest.fixture
def measured(make_upstream: Callable[[], Upstream], git: Git) -> Upstream:
    """A repository whose results file was recorded at the commit of its code, and committed."""
    upstream = make_upstream()
    upstream.commit({"src/a.py": "x = 1\n", "docs/notes.md": "notes\n"}, "code")
    _record(upstream, git, _short(git, upstream))
    return upstream


def _check(upstream: Upstream) -> stale.Freshness:
    return stale.freshness(upstream.work, RESULTS, CODE)


def test_a_result_recorded_at_head_s_code_is_fresh(measured: Upstream, git: Git) -> None:
    found = _check(measured)
    assert (found.stale, found.reason, found.since) == (False, "fresh", [])
    assert found.commit == _short(git, measured, "HEAD~1")


def test_a_later_commit_to_its_code_makes_it_stale(measured: Upstream, git: Git) -> None:
    measured.commit({"src/b.py": "y = 2\n"}, "more code")
    found = _check(measured)
    assert found.stale
    assert found.since == [_short(git, measured)]


def test_a_later_commit_elsewhere_leaves_it_fresh(measured: Upstream) -> None:
    measured.commit({"docs/notes.md": "more notes\n"}, "notes")
    assert not _check(measured).stale


@pytest.mark.parametrize(
    ("stamp", "reason"),
    [
        ("unknown", "its commit is unknown"),
        (None, "its commit is unknown"),
        ("HEAD-dirty", "measured from uncommitted code"),
        ("0000000", "its commit is not in this clone"),
    ],
)
def test_a_result_whose_commit_cannot_be_read_is_stale(
    measured: Upstream, git: Git, stamp: str | None, reason: str
) -> None:
    written = _short(git, measured) + "-dirty" if stamp == "HEAD-dirty" else stamp
    _record(measured, git, written)  # type: ignore[arg-type]
    found = _check(measured)
    assert (found.stale, found.reason) == (True, reason)


def test_a_result_from_a_commit_off_head_s_history_is_stale(measured: Upstream, git: Git) -> None:
    git("switch", "--quiet", "-c", "side", cwd=measured.work)
    git("commit", "--quiet", "--allow-empty", "-m", "side", cwd=measured.work)
    side = _short(git, measured)
    git("switch", "--quiet", "main", cwd=measured.work)
    _record(measured, git, side)
    found = _check(measured)
    assert (found.stale, found.reason) == (True, "its commit is not an ancestor of HEAD")


def test_a_shallow_clone_says_it_cannot_tell(measured: Upstream, git: Git, tmp_path: Path) -> None:
    measured.commit({"docs/notes.md": "later\n"}, "notes")
    shallow = tmp_path / "shallow"
    git("clone", "--quiet", "--depth", "1", f"file://{measured.bare}", shallow)
    found = stale.freshness(shallow, RESULTS, CODE)
    assert found.stale
    assert "shallow" in found.reason


def test_a_results_file_no_benchmark_names_is_stale(measured: Upstream) -> None:
    found = stale.freshness(measured.work, RESULTS, ())
    assert (found.stale, found.reason) == (True, "no benchmark names its code")


def test_every_results_file_of_this_repository_is_mapped_to_code_that_exists() -> None:
    mapping = stale.measured()
    files = {p.as_posix() for p in stale.ROOT.glob("*/results/*.json")}
    assert {f"{stale.ROOT.as_posix()}/{name}" for name in mapping} == files
    for results, code in mapping.items():
        assert code, f"{results}: no CODE names what it measures"
        for path in code:
            assert (stale.ROOT / path).exists(), f"{results}: {path} does not exist"
    assert mapping["bench/results/soak.json"][0] == "bench/soak.py"
    assert "evaluation/" in mapping["eval/results/eval.json"]


def test_the_command_exits_1_and_names_every_stale_file(
    measured: Upstream,
    git: Git,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(stale, "measured", lambda root: {RESULTS: CODE})
    assert stale.main(["--json"], root=measured.work) == 0
    measured.commit({"src/a.py": "x = 2\n"}, "change")
    capsys.readouterr()
    assert stale.main(["--json"], root=measured.work) == 1
    shown = json.loads(capsys.readouterr().out)
    assert [(f["results"], f["stale"]) for f in shown] == [(RESULTS, True)]


# The stamps a results file records.


def test_a_stamp_is_dirty_only_when_its_own_code_is_uncommitted(
    measured: Upstream, git: Git
) -> None:
    head = _short(git, measured)
    (measured.work / "docs/notes.md").write_text("edited\n")
    assert record.commit(CODE, root=measured.work) == head
    assert report.source_commit(measured.work) == head  # evaluation.report.CODE: no docs/
    (measured.work / "src/new.py").write_text("z = 3\n")
    assert record.commit(CODE, root=measured.work) == head + "-dirty"
    assert record.dirty(CODE, root=measured.work) == ["src/new.py"]


def test_the_evaluation_s_stamp_is_dirty_when_the_code_it_evaluates_is(
    measured: Upstream, git: Git
) -> None:
    head = _short(git, measured)
    (measured.work / "workers").mkdir()
    (measured.work / "workers/stage.py").write_text("edited\n")
    assert report.source_commit(measured.work) == head + "-dirty"


def test_a_stamp_outside_a_clone_is_unknown(tmp_path: Path) -> None:
    assert record.commit(CODE, root=tmp_path) == "unknown"
    assert report.source_commit(tmp_path) == "unknown"


def test_python_m_bench_refuses_to_record_over_uncommitted_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_main, "dirty_code", lambda names: {"soak": ["workers/stage.py"]})
    ran: list[str] = []
    monkeypatch.setattr(bench_main.soak, "run", lambda progress: ran.append("soak") or {})
    assert bench_main.main(["soak"]) == 2
    said = capsys.readouterr().err
    assert "workers/stage.py" in said and "--allow-dirty" in said
    assert ran == []


def test_dirty_code_names_each_benchmark_whose_code_is_uncommitted(
    measured: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Probe:
        CODE = CODE

    class Other:
        CODE = ("lib/",)

    monkeypatch.setattr(bench_main, "BENCHMARKS", {"probe": Probe, "other": Other})
    assert bench_main.dirty_code(["probe", "other"], root=measured.work) == {}
    (measured.work / "src/a.py").write_text("x = 9\n")
    found = bench_main.dirty_code(["probe", "other"], root=measured.work)
    assert found == {"probe": ["src/a.py"]}


def _record_with_digest(upstream: Upstream, git: Git) -> None:
    """Commit a results file stamped as `bench.record.save` stamps one: HEAD's commit and the
    digest of its code."""
    digest = code_digest(upstream.work, CODE)
    figures = {"commit": _short(git, upstream), "code": digest, "p50_ms": 1.5}
    upstream.commit({RESULTS: json.dumps(figures)}, "results")


def test_a_shallow_clone_tells_a_fresh_result_by_its_code_s_digest(
    make_upstream: Callable[[], Upstream], git: Git, tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({"src/a.py": "x = 1\n"}, "code")
    _record_with_digest(upstream, git)
    upstream.commit({"docs/notes.md": "later\n"}, "notes")  # not its code
    shallow = tmp_path / "shallow"
    git("clone", "--quiet", "--depth", "1", f"file://{upstream.bare}", shallow)

    found = stale.freshness(shallow, RESULTS, CODE)

    assert (found.stale, found.reason) == (False, "fresh")


def test_control_a_shallow_clone_tells_a_changed_code_s_result_stale_by_its_digest(
    make_upstream: Callable[[], Upstream], git: Git, tmp_path: Path
) -> None:
    upstream = make_upstream()
    upstream.commit({"src/a.py": "x = 1\n"}, "code")
    _record_with_digest(upstream, git)
    upstream.commit({"src/a.py": "x = 2\n"}, "changed code")
    shallow = tmp_path / "shallow"
    git("clone", "--quiet", "--depth", "1", f"file://{upstream.bare}", shallow)

    found = stale.freshness(shallow, RESULTS, CODE)

    assert (found.stale, found.reason) == (True, "its code changed since")
    # In the full clone, history names the commit that changed it.
    full = stale.freshness(upstream.work, RESULTS, CODE)
    assert full.stale and full.since == [_short(git, upstream)]


def test_the_digest_changes_with_the_code_and_only_with_it(measured: Upstream) -> None:
    before = code_digest(measured.work, CODE)
    measured.commit({"docs/notes.md": "other\n"}, "notes")
    assert code_digest(measured.work, CODE) == before
    measured.commit({"src/a.py": "x = 3\n"}, "code")
    assert code_digest(measured.work, CODE) != before

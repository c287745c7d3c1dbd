"""The corpus format and the scripted policies, without services: instance folders are read and
refused with the file named; the oracle and the saboteur script each stage through real tool
names, selected by the instance's issue title."""

from __future__ import annotations

import io
import json
from fnmatch import fnmatch
from pathlib import Path

import pytest
from rich.console import Console

from evaluation.corpus import CorpusError, load_corpus, load_instance
from evaluation.harness import Evaluation, Result, figures, stopped
from evaluation.policies import SABOTEUR_MARK, command_for, scenario
from evaluation.report import ResultsFile, costs, markdown, proof, report, results_file, tables
from orchestrator.core.models import (
    Issue,
    IssueSource,
    Iteration,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)  # fmt: skip
from orchestrator.core.pipeline import load_pipeline
from sandbox.environment import from_table
from testkit.gemini.scenario import Scenario

GOLD = """diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -10,3 +10,3 @@ def mean(values):
     total = sum(values)
-    return total / len(values)
+    return total / len(values) if values else 0
 
"""
TESTS = """diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1,1 +1,4 @@
 from calc.core import mean
+
+def test_mean_of_nothing():
+    assert mean([]) == 0
"""
INSTANCE = """id = "calc-1.0-mean-empty"
summary = "mean([]) raises ZeroDivisionError"
[source]
pypi = "calc"
version = "1.0"
[environment]
test = "python -m pytest -q"
[tests]
runner = "pytest"
fail_to_pass = ["tests/test_core.py::test_mean_of_nothing"]
pass_to_pass = ["tests/test_core.py::test_mean"]
"""
SHIPPED = Path(__file__).resolve().parents[2] / "eval" / "corpus"
NATIVE = {
    "markupsafe-3.0.2-str-subclass": "src/markupsafe/_speedups.c",
    "msgpack-1.2.4-header-prealloc": "msgpack/unpack.h",
    "propcache-0.5.3-lookup-error": "src/propcache/_helpers_c.pyx",
    "simplejson-4.3.0-allow-nan-message": "simplejson/_speedups.c",
}
"""The shipped instances whose fix is to compiled code, and the compiled file it changes."""
ISSUE = {"number": 7, "title": "mean() of an empty list crashes", "body": "ZeroDivisionError"}


def make(root: Path, name: str = "calc-1.0-mean-empty", **replace: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    files = {"instance.toml": INSTANCE, "break.patch": "x", "test.patch": TESTS,
             "gold.patch": GOLD, "issue.json": json.dumps(ISSUE), **replace}  # fmt: skip
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


def test_an_instance_folder_is_read_whole(tmp_path: Path) -> None:
    instance = load_instance(make(tmp_path))

    assert (instance.source.pypi, instance.source.version) == ("calc", "1.0")
    assert instance.tests.fail_to_pass == ("tests/test_core.py::test_mean_of_nothing",)
    assert instance.title == "mean() of an empty list crashes"
    assert instance.files("gold.patch") == ["calc/core.py"]
    assert instance.environment == {"test": "python -m pytest -q"}


@pytest.mark.parametrize(
    ("replace", "said"),
    [
        ({"instance.toml": INSTANCE.replace('runner = "pytest"', 'runner = "nose"')},
         "instance.toml: 1 validation error"),
        ({"instance.toml": INSTANCE.replace("fail_to_pass = [", "fail_to_pass = [ # ")},
         "instance.toml"),
        ({"issue.json": "{}"}, "issue.json: not a GitHub issue with a title"),
        ({"instance.toml": INSTANCE.replace("calc-1.0-mean-empty", "other")},
         "is not the folder's name"),
    ],
)  # fmt: skip
def test_a_bad_instance_is_refused_naming_the_file(
    tmp_path: Path, replace: dict[str, str], said: str
) -> None:
    with pytest.raises(CorpusError, match=said.replace("(", r"\(")):
        load_instance(make(tmp_path, **replace))


def test_each_shipped_environment_is_a_spec_and_a_native_fix_is_rebuilt() -> None:
    """Every shipped instance's [environment] is a valid spec; for a fix to compiled code it
    installs a compiler and Python's headers, and its build step rebuilds on that file."""
    instances = {i.id: i for i in load_corpus(SHIPPED)}
    specs = {i: from_table(e.environment, origin=i) for i, e in instances.items()}

    assert set(NATIVE) <= set(instances)
    for name, fixed in NATIVE.items():
        spec = specs[name]
        assert fixed in instances[name].files("gold.patch"), name
        assert {"build-essential", "python3-dev"} <= set(spec.packages), name
        assert spec.build, name
        assert any(fnmatch(fixed, pattern) for pattern in spec.build_inputs), name


def test_a_missing_file_and_an_unknown_id_are_named(tmp_path: Path) -> None:
    folder = make(tmp_path)
    (folder / "gold.patch").unlink()
    with pytest.raises(CorpusError, match=r"gold\.patch is missing"):
        load_corpus(tmp_path)
    with pytest.raises(CorpusError, match="no instance"):
        load_corpus(tmp_path / "empty")
    (folder / "gold.patch").write_text(GOLD)
    with pytest.raises(CorpusError, match="no instance nope"):
        load_corpus(tmp_path, ("nope",))


def test_the_policies_script_every_stage_per_instance_with_real_tools(tmp_path: Path) -> None:
    instance = load_instance(make(tmp_path))
    fixer = load_pipeline("fixer")

    for mode in ("oracle", "saboteur", "stale"):
        played = Scenario.model_validate(scenario([instance], mode))  # type: ignore[arg-type]
        for stage in fixer.stages:
            script = played.script_for(stage.name)
            assert script is not None
            steps = script.step(0, f"... {instance.title} ...")
            assert steps != script.step(0, "another instance")  # chosen by the title
            for step in [script.step(i, instance.title) for i in range(4)]:
                for part in step.parts():
                    if "functionCall" in part:
                        name = part["functionCall"]["name"]
                        assert name in stage.tools, (mode, stage.name, name)

    oracle = scenario([instance], "oracle")["agents"]
    fix_call = oracle["fix"]["variants"][0]["steps"][0]["call"]
    assert fix_call == {"name": "apply_patch", "args": {"patch": GOLD}}
    reproduce = oracle["reproduce"]["variants"][0]["steps"]
    assert reproduce[0]["call"]["args"]["patch"] == TESTS
    assert reproduce[1]["json"]["test_command"] == (
        "python -m pytest -q -p no:cacheprovider tests/test_core.py::test_mean_of_nothing"
    )
    stale = scenario([instance], "stale")["agents"]["reproduce"]["variants"][0]["steps"]
    assert stale[1]["json"]["test_command"] == (  # a test that passes already
        "python -m pytest -q -p no:cacheprovider tests/test_core.py::test_mean"
    )
    saboteur = scenario([instance], "saboteur")["agents"]
    wrong = saboteur["fix"]["variants"][0]["steps"][0]["call"]["args"]["patch"]
    assert wrong.endswith(f"@@ -10,1 +10,2 @@\n     total = sum(values)\n+# {SABOTEUR_MARK}\n")


def test_a_unittest_instance_runs_its_tests_by_its_own_command(tmp_path: Path) -> None:
    unittest = INSTANCE.replace('runner = "pytest"', 'runner = "unittest"').replace(
        'test = "python -m pytest -q"', 'test = "python -m unittest discover tests"'
    )
    instance = load_instance(make(tmp_path, **{"instance.toml": unittest}))

    assert command_for(instance, ["test_core.T.test_a", "test_core.T.test_b"]) == (
        "python -m unittest discover tests -k test_core.T.test_a -k test_core.T.test_b"
    )


def _two_oracle_results() -> Evaluation:
    results = [
        Result("a", "oracle", resolved=True, published=True, fail_to_pass=[1, 1],
               pass_to_pass=[9, 9], model_calls=12, prompt_tokens=3000, output_tokens=400),
        Result("b", "oracle", reason="fix: the reproducing tests still fail (after 3 iterations)",
               fail_to_pass=[0, 2], pass_to_pass=[5, 5]),
    ]  # fmt: skip
    return Evaluation("eval/corpus", results, {"oracle": 61.0})


def test_the_report_has_a_summary_and_a_row_per_instance() -> None:
    results = results_file(_two_oracle_results(), command="baton eval x", environment="here",
                           commit="abc1234", date="2026-12-02 10:00")  # fmt: skip
    text = markdown(ResultsFile("eval/results/eval.json", results))

    assert "From `eval/results/eval.json`, commit abc1234, 2026-12-02 10:00: `baton eval x`" in text
    assert (
        "## oracle: 1 of 2 resolved (50 %), 1 published, 0 false publications, wall time 61 s"
        in text
    )
    assert "| a | no | no | no | yes | **yes** | 1/1 | 9/9 | - | 12 | 3,000/400 | 0 | 0 |" in text
    assert "| oracle | 2 | 1 | 0 | 1 | 0 | **0** | - |" in text
    assert "| b | no | no | no | no | no | 0/2 | 5/5 |" in text
    assert "- b: fix: the reproducing tests still fail (after 3 iterations)" in text


def test_the_results_file_holds_each_modes_totals_and_reads_back_as_it_was_written() -> None:
    evaluation = _two_oracle_results()
    evaluation.results += [
        Result("a", "saboteur", reproduced=True, proven=True, published=True, fail_to_pass=[0, 1],
               stopped="not stopped"),
        # a special case can pass the hidden tests: published, it is a false publication still
        Result("a", "saboteur:special-case", reproduced=True, proven=True, published=True,
               resolved=True, stopped="not stopped"),
        Result("b", "saboteur:special-case", reproduced=True, stopped="proof: special case"),
    ]  # fmt: skip
    evaluation.wall_s["saboteur"] = 30.0
    results = results_file(evaluation, command="baton eval x", environment="here",
                           commit="abc1234", date="2026-12-02 10:00")  # fmt: skip

    again = json.loads(json.dumps(results))
    assert again["commit"] == "abc1234" and again["date"] == "2026-12-02 10:00"
    assert again["modes"]["oracle"] == {
        "instances": 2, "reproduced": 0, "proven": 0, "published": 1, "resolved": 1,
        "resolved_share": 0.5, "published_unresolved": 0, "false_publications": 0,
        "stopped": {"": 2}, "wall_s": 61.0,
    }  # fmt: skip
    assert again["modes"]["saboteur"]["published_unresolved"] == 1
    special = again["modes"]["saboteur:special-case"]
    assert (special["published_unresolved"], special["false_publications"]) == (0, 1)
    assert special["stopped"] == {"not stopped": 1, "proof: special case": 1}
    table = report(ResultsFile("eval/results/eval.json", again))
    assert (
        "| saboteur:special-case | 2 | 1 | 1 | 1 | 0 | **1** | 1 not stopped, "
        "1 proof: special case |" in table
    )
    assert [Result(**r) for r in again["results"]] == evaluation.results
    line = proof(ResultsFile("eval/results/eval.json", again))
    assert (
        "the saboteur's wrong fixes (marker): proven in 1 of 1, published in 1 (1 false "
        "publications)" in line
    )
    assert "(special-case): proven in 1 of 2, published in 1 (1 false publications)" in line


@pytest.mark.parametrize(
    ("published", "reason", "where"),
    [
        (True, None, "not stopped"),
        (False, "reproduce: could not reproduce the report: …", "reproduction"),
        (False, "review: the reviewer found …", "review"),
        (False, "fix: the change weakens the tests: t failed … (after 3 iterations)",
         "proof: weakened tests"),
        (False, "fix: the change special-cases the tests' inputs: x.py:3 …", "proof: special case"),
        (False, "fix: the change alters only comments, whitespace or docstrings in x.py",
         "proof: inert change"),
        (False, "fix: something new", "proof: other"),
        (False, None, "not finished"),
    ],
)  # fmt: skip
def test_where_a_run_was_stopped_is_named_by_its_stage_or_proof_check(
    published: bool, reason: str | None, where: str
) -> None:
    assert stopped(published, reason) == where


def test_the_table_fits_80_columns_with_every_instance_and_verdict_whole() -> None:
    name = "boltons-iterutils-chunked-even"
    results = [
        Result(name, "oracle", resolved=True, published=True, fail_to_pass=[1, 1],
               pass_to_pass=[120, 120], model_calls=12, prompt_tokens=13000, output_tokens=400,
               wall_s=48.0),
    ]  # fmt: skip
    evaluation = Evaluation("eval/corpus", results, {"oracle": 61.0})
    for width in (80, 200):
        console = Console(width=width, record=True, file=io.StringIO())
        for table in tables(evaluation, width=width):
            console.print(table)
        lines = console.export_text().splitlines()
        assert all(len(line) <= width for line in lines)
        row = next(line for line in lines if name in line)
        header = next(line for line in lines if "instance" in line)
        assert "resolved" in header and "fail→pass" in header and "pass→pass" in header
        assert ("model calls" in header) == (width == 200)  # left out when narrow
        assert "120/120" in row


def test_a_runs_figures_count_each_stages_calls_and_time_every_iteration_included() -> None:
    done = StageStatus.DONE
    run = RunRecord(
        id="r", pipeline="fixer", repo="/r", commit="c", idempotency_key="k",
        issue=Issue(source=IssueSource.TEXT, title="t"), status=RunStatus.DONE,
        stages={
            "reproduce": StageRecord(status=done, requests=3, started_at=10.0, finished_at=14.5,
                                     prompt_tokens_total=300, output_tokens=30),
            "fix": StageRecord(status=done, iterations=[
                Iteration(number=1, attempt=1, passed=False, requests=4, started_at=20.0,
                          finished_at=30.0, prompt_tokens_total=600, output_tokens=60),
                Iteration(number=2, attempt=1, passed=True, requests=2, started_at=31.0,
                          finished_at=33.0, prompt_tokens_total=400, output_tokens=40),
            ]),
            "review": StageRecord(status=done, requests=1, started_at=40.0, finished_at=41.25,
                                  prompt_tokens_total=50, output_tokens=5),
            "pr": StageRecord(status=StageStatus.PENDING),  # never started: no figures
        },
    )  # fmt: skip

    result = figures(Result("a", "oracle"), run)

    assert result.model_calls == 3 + 4 + 2 + 1
    assert result.stage_calls == {"reproduce": 3, "fix": 6, "review": 1}
    assert result.stage_s == {"reproduce": 4.5, "fix": 12.0, "review": 1.25}
    assert result.stage_tokens == {"reproduce": [300, 30], "fix": [1000, 100], "review": [50, 5]}


def test_the_cost_table_shows_each_stages_median_calls_tokens_and_time_of_published_runs() -> None:
    runs = [
        Result("a", "oracle", published=True, stage_calls={"fix": 4, "review": 1},
               stage_s={"fix": 9.0, "review": 1.0},
               stage_tokens={"fix": [3000, 300], "review": [2001, 20]}),
        Result("b", "oracle", published=True, stage_calls={"fix": 2, "review": 1},
               stage_s={"fix": 5.0, "review": 3.0},
               stage_tokens={"fix": [1500, 100], "review": [1999, 10]}),
        Result("c", "oracle", published=True, stage_calls={"fix": 6, "review": 1},
               stage_s={"fix": 20.0, "review": 2.0}),
        # not published: the cost of a run cut short is not a run's cost
        Result("d", "oracle", stage_calls={"fix": 30}, stage_s={"fix": 300.0}),
        Result("a", "stale", published=True, stage_calls={"reproduce": 9}, stage_s={"x": 1.0}),
    ]  # fmt: skip

    lines = costs(runs)

    assert lines[0] == "What each stage cost the 3 published runs of oracle (medians):"
    assert "| fix | 3 | 4 | 1,500/100 | 9.00 |" in lines
    # two runs recorded the review's tokens, c none: the lower middle one of 0, 1999 and 2001
    assert "| review | 3 | 1 | 1,999/10 | 2.00 |" in lines
    assert len(lines) == 4 + 2 + 1
    assert costs([r for r in runs if r.mode == "stale"]) == []  # no oracle runs: no table

"""`execute_stage` as a function of its inputs: no Redis, no Docker, no network.

The model is the real google-genai client (as a worker builds it) talking to the fake Gemini
server inside this process (`testkit.gemini.InProcessGemini`); code stages work in host-side
working copies of the demo's sample repository (`testkit.sandboxes.LocalSandboxes`).

The tests of verification, reproduction, proof, the loop's verdict and publication run over the
fixer and its renamed twin (`tests/twin.py`, `OVER_BOTH`): written in the fixer's names, their
scripts are renamed on the way to the model and the outputs strictly renamed back, after they
validated against the pipeline's own schema.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from demo import SCENARIO
from demo.runner import make_sample_repo
from orchestrator.core.git import resolve_commit
from orchestrator.core.pipeline import ISSUE_KEY, PREVIOUS_ATTEMPT_KEY, load_pipeline
from orchestrator.core.rules import CompactionRule, StageBudget
from testkit.inprocess import InProcessGemini
from testkit.sandboxes import LocalSandboxes
from testkit.sinks import MemoryArtifacts
from tests.fences import failing_at
from tests.repos import Git
from tests.twin import Names, fixer
from workers.errors import (
    NotReproducedError,
    ProofFailedError,
    StageCancelledError,
    StageError,
    StageOutputError,
)
from workers.inputs import StageInputs
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.stage import StageOutput, StageSinks, execute_stage

DEMO = json.loads(SCENARIO.read_text())
TEST_COMMAND = "python3 -m unittest discover -s tests -t ."
ISSUE = "Title: ZeroDivisionError in average_price_cents\nSource: text"
REPRO_ID = (
    "tests.test_empty_cart_checkout.EmptyCartCheckoutTest.test_checkout_summary_of_an_empty_cart"
)


def steps(agent: str) -> list[dict[str, Any]]:
    return list(DEMO["agents"][agent]["steps"])


def output_of(agent: str) -> dict[str, Any]:
    final: dict[str, Any] = steps(agent)[-1]["json"]
    return final


OVER_BOTH = pytest.mark.parametrize("harness", ["fixer", "twin"], indirect=True)
"""Runs a test over the fixer and its renamed twin."""


class Harness:
    """One stage execution's surroundings: a fake model, sinks, sandboxes, a remote; and the
    pipeline of the fixer's shape it runs stages of, in the fixer's names (`names`)."""

    def __init__(self, tmp_path: Path, names: Names | None = None) -> None:
        self.names = names or fixer()
        self.pipeline = load_pipeline(self.names.pipeline)
        self.remote = make_sample_repo(tmp_path / "shopcart.git")
        self.commit = resolve_commit(str(self.remote))
        self.sandboxes = LocalSandboxes(tmp_path / "sandbox-cache")
        self.publisher = Publisher(RepoCache(tmp_path / "publish-cache"))
        self.artifacts = MemoryArtifacts(run_id="r1")
        self.audit: list[dict[str, Any]] = []
        self.sinks = StageSinks(artifacts=self.artifacts, audit=self.audit.extend)
        self.fake = InProcessGemini()

    def inputs(self, stage: str, **overrides: Any) -> StageInputs:
        """The inputs of the fixer's `stage` (its counterpart in this pipeline), upstream
        outputs the demo's."""
        spec = self.pipeline.stage(self.names.stage(stage))
        fixer_stage = {own: name for name, own in self.names.stages.items()}
        state: dict[str, Any] = {ISSUE_KEY: ISSUE}
        for key in spec.inputs:
            if key not in (ISSUE_KEY, PREVIOUS_ATTEMPT_KEY):
                state[key] = self.names.output(fixer_stage[key], output_of(fixer_stage[key]))
        values: dict[str, Any] = {
            "run_id": "r1", "pipeline": self.pipeline.name, "spec": spec, "attempt": 1,
            "repo": str(self.remote), "commit": self.commit, "state": state,
        }  # fmt: skip
        return StageInputs(**{**values, **overrides})

    def run_own(self, inputs: StageInputs, scripts: dict[str, Any], **kwargs: Any) -> StageOutput:
        """Run a stage with the fake model playing `scripts` (by the fixer's agent names, in
        its names); the output in the pipeline's own names."""
        own = {self.names.stages.get(a, a): self.names.script(a, s) for a, s in scripts.items()}
        self.fake = InProcessGemini({"agents": own})
        return asyncio.run(
            execute_stage(
                inputs,
                model=self.fake.model(transient_attempts=1),
                sinks=self.sinks,
                sandboxes=self.sandboxes,
                publisher=self.publisher,
                **kwargs,
            )
        )

    def run(self, inputs: StageInputs, scripts: dict[str, Any], **kwargs: Any) -> StageOutput:
        """`run_own`, its output valid for the pipeline's own schema and read back in the
        fixer's names."""
        out = self.run_own(inputs, scripts, **kwargs)
        inputs.spec.schema_class().model_validate(out.output)
        fixer_stage = {own: name for name, own in self.names.stages.items()}[inputs.spec.name]
        return replace(out, output=self.names.output_back(fixer_stage, out.output))

    def branches(self) -> list[str]:
        return Git()("for-each-ref", "--format=%(refname:short)", cwd=self.remote).split()


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """The fixer's harness; with `OVER_BOTH`, the fixer's and then its renamed twin's."""
    which = getattr(request, "param", "fixer")
    return Harness(tmp_path, request.getfixturevalue("twin") if which == "twin" else None)


@cache
def demo_reproduction(names: Names) -> tuple[str, dict[str, Any]]:
    """The demo's reproduce stage, run once per test process and pipeline in a harness of its
    own (its diff and output do not depend on the commit): its change and its output, in the
    pipeline's own names."""
    with tempfile.TemporaryDirectory(prefix="baton-reproduce-") as tmp:
        harness = Harness(Path(tmp), names)
        inputs = harness.inputs("reproduce")
        reproduced = harness.run_own(inputs, {"reproduce": steps("reproduce")})
        return harness.artifacts.data["workspace.diff"].decode(), reproduced.output


def fix_inputs(harness: Harness, **overrides: Any) -> StageInputs:
    """The fix stage's inputs after the demo's reproduce stage ran: its test applied first,
    the reproduction the proof runs read through the reproduce stage's rule, the sample
    repository's suite."""
    diff, output = demo_reproduction(harness.names)
    reproducer = harness.pipeline.stage(harness.names.stage("reproduce"))
    values = {
        "verify_command": TEST_COMMAND,
        "upstream_diff": diff,
        "reproduction": reproducer.reproduction(output),
        "suite_command": TEST_COMMAND,
        **overrides,
    }
    return harness.inputs("fix", **values)


@cache
def demo_fix_diff(names: Names) -> str:
    """The demo fix's change, as the fix stage hands it on: run once per test process and
    pipeline in a harness of its own, as `demo_reproduction` is (it does not depend on the
    commit either)."""
    with tempfile.TemporaryDirectory(prefix="baton-fix-") as tmp:
        harness = Harness(Path(tmp), names)
        harness.run(fix_inputs(harness), {"fix": steps("fix")})
        return harness.artifacts.data["workspace.diff"].decode()


def test_a_stage_without_tools_returns_its_validated_output(harness: Harness) -> None:
    out = harness.run(harness.inputs("triage"), {"triage": steps("triage")})

    assert out.output == {**output_of("triage")}
    assert out.compacted is None
    assert harness.sinks.usage.requests == 1
    assert harness.sandboxes.requests == []
    system = harness.fake.requests()[0]["request"]["systemInstruction"]["parts"][0]["text"]
    assert ISSUE in system
    assert {e["session"] for e in harness.audit} == {"r1:triage:1"}


def test_a_code_stage_works_in_a_workspace_of_the_pinned_commit(harness: Harness) -> None:
    out = harness.run(harness.inputs("search"), {"search": steps("search")})

    assert out.output["locations"][0]["path"] == "shopcart/cart.py"
    (request,) = harness.sandboxes.requests
    assert (request.repo, request.commit, request.network) == (
        str(harness.remote),
        harness.commit,
        None,
    )
    assert request.labels == {"baton.run": "r1", "baton.stage": "search", "baton.attempt": "1"}
    assert harness.sandboxes.open_now == 0
    read = harness.fake.requests()[2]["request"]["contents"][-1]["parts"][0]
    assert "def average_price_cents" in json.dumps(read["functionResponse"]["response"])


def test_an_invalid_reply_gets_one_repair_turn(harness: Harness) -> None:
    bad = {"json": {"actionable": "perhaps"}}
    out = harness.run(harness.inputs("triage"), {"triage": [bad, steps("triage")[0]]})

    assert out.output == output_of("triage")
    repair = harness.fake.requests()[1]["request"]["contents"][-1]["parts"][0]["text"]
    assert repair.startswith("Your reply could not be used: the reply does not match Triage")
    assert harness.sinks.usage.requests == 2


def test_a_reply_still_invalid_after_the_repair_turn_fails_the_stage(harness: Harness) -> None:
    bad = {"json": {"actionable": "perhaps"}}

    with pytest.raises(StageOutputError, match="invalid after one repair turn"):
        harness.run(harness.inputs("triage"), {"triage": [bad]})
    assert harness.sinks.usage.requests == 2


def test_requests_are_trimmed_to_the_stage_budget(harness: Harness) -> None:
    read = {"call": {"name": "read_file", "args": {"path": "shopcart/cart.py"}}}
    spec = harness.pipeline.stage("search")
    budget = StageBudget(max_request_tokens=2_500, max_model_calls=12)
    tight = spec.model_copy(update={"budget": budget})

    out = harness.run(
        harness.inputs("search", spec=tight), {"search": [read] * 8 + [steps("search")[-1]]}
    )

    assert out.output["root_cause"] == output_of("search")["root_cause"]
    sizes = [entry["prompt_tokens"] for entry in harness.fake.requests()]
    assert len(sizes) == 9
    assert max(sizes) <= 2_500 * 1.1, sizes
    assert sizes[-1] < sum(sizes[:4])  # without trimming the last request carries them all


def test_a_compacting_stage_keeps_in_a_summary_what_trimming_would_drop(
    harness: Harness,
) -> None:
    def read(path: str) -> dict[str, Any]:
        return {"call": {"name": "read_file", "args": {"path": path}}}

    spec = harness.pipeline.stage("search")
    compacting = spec.model_copy(
        update={
            "budget": StageBudget(max_request_tokens=2_000, max_model_calls=20),
            "compaction": CompactionRule(overlap=1, max_summary_tokens=200),
        }
    )
    inputs = harness.inputs("search", spec=compacting)
    reads = [read("shopcart/cart.py")] + [read("tests/test_cart.py")] * 8
    scripts = {
        "search": [*reads, steps("search")[-1]],
        "search.compaction": [{"extract": "def average_price_cents"}],
    }

    out = harness.run(inputs, scripts)

    sent = harness.fake.requests()
    last = [entry["request"] for entry in sent if entry["agent"] == "search"][-1]
    first_message = " ".join(part.get("text", "") for part in last["contents"][0]["parts"])
    read_paths = [
        part["functionResponse"]["response"]["path"]
        for content in last["contents"]
        for part in content["parts"]
        if "functionResponse" in part
    ]
    compactions = [entry for entry in harness.audit if entry["kind"] == "compaction"]
    assert out.output["root_cause"] == output_of("search")["root_cause"]
    assert max(entry["prompt_tokens"] for entry in sent) <= 2_000
    assert "def average_price_cents(self) -> int:" in first_message
    assert "shopcart/cart.py" not in read_paths
    assert compactions and all(
        {key: entry[key] for key in inputs.labels} == inputs.labels for entry in compactions
    )
    assert harness.sinks.usage.requests == len(sent) == len(reads) + 1 + len(compactions)


@OVER_BOTH
def test_the_fix_is_verified_before_and_after_and_measured_fields_replace_claims(
    harness: Harness,
) -> None:
    claims = {**output_of("fix"), "tests_before": None, "tests_after": None, "proof": None}
    fix = [*steps("fix")[:-1], {"json": claims}]

    out = harness.run(fix_inputs(harness), {"fix": fix})

    before, after = out.output["tests_before"], out.output["tests_after"]
    assert before["command"] == after["command"] == TEST_COMMAND
    # the sample's two empty-cart tests and the reproducing one fail; all five pass after
    assert (before["exit_code"] != 0, before["passed"], before["failed"]) == (True, 2, 3)
    assert (after["exit_code"], after["passed"], after["failed"]) == (0, 5, 0)
    saved = harness.artifacts.data
    assert "ZeroDivisionError" in saved["tests-before.log"].decode()
    assert "if count == 0:" in saved["workspace.diff"].decode()
    assert "tests/test_empty_cart_checkout.py" in saved["workspace.diff"].decode()


@OVER_BOTH
def test_a_reproduction_is_run_by_baton_on_the_unchanged_code(harness: Harness) -> None:
    claims = {**output_of("reproduce"), "reproduced": {"command": "x", "exit_code": 1,
              "failed_tests": ["made-up"], "expected_failure_seen": True}}  # fmt: skip
    out = harness.run(
        harness.inputs("reproduce"), {"reproduce": [*steps("reproduce")[:-1], {"json": claims}]}
    )

    measured = out.output["reproduced"]
    assert measured["failed_tests"] == [REPRO_ID]
    assert measured["expected_failure_seen"] is True
    assert measured["command"].endswith("tests.test_empty_cart_checkout -v")  # ids asked for
    assert "ZeroDivisionError" in harness.artifacts.data["reproduce.log"].decode()
    # measured in a second, clean workspace, not in the one the model wrote the test in
    assert len(harness.sandboxes.requests) == 2
    assert harness.sandboxes.open_now == 0


def _reproduction_writing(test: str, expected: str = "ZeroDivisionError") -> list[dict[str, Any]]:
    path = "tests/test_repro.py"
    write = {
        "call": {"name": "edit_file", "args": {"path": path, "old_text": "", "new_text": test}}
    }
    said = {**output_of("reproduce"), "test_files": [path], "expected_failure": expected,
            "test_command": "python3 -m unittest tests.test_repro"}  # fmt: skip
    return [write, {"json": said}]


PASSING_TEST = """import unittest
from shopcart.cart import Cart, Item


class T(unittest.TestCase):
    def test_total(self):
        self.assertEqual(Cart([Item("a", 5)]).total_cents(), 5)
"""
WRONG_REASON_TEST = PASSING_TEST.replace("), 5)", "), 6)")


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (_reproduction_writing(PASSING_TEST), "ran no failing test (exit code 0, 1 passed"),
        (
            _reproduction_writing(WRONG_REASON_TEST),
            "never shows 'ZeroDivisionError', the failure the report is about; it ends: "
            "AssertionError: 5 != 6 | ",
        ),
        (
            [
                {"call": {"name": "edit_file", "args": {"path": "shopcart/cart.py",
                 "old_text": "", "new_text": "x = 1\n"}}},
                {"json": {**output_of("reproduce"), "test_files": ["shopcart/cart.py"]}},
            ],
            "names files that are not tests: shopcart/cart.py",
        ),
        (
            [
                {"call": {"name": "edit_file", "args": {"path": "shopcart/extra.py",
                 "old_text": "", "new_text": "x = 1\n"}}},
                *steps("reproduce")[1:],
            ],
            "changes files that are not tests: shopcart/extra.py",
        ),
    ],
    ids=["passes-already", "fails-for-another-reason", "names-a-source-file", "changes-code"],
)  # fmt: skip
@OVER_BOTH
def test_a_reproduction_that_does_not_fail_as_reported_is_refused(
    harness: Harness, script: list[dict[str, Any]], said: str
) -> None:
    with pytest.raises(NotReproducedError, match=re.escape(said)):
        harness.run(harness.inputs("reproduce"), {"reproduce": script})
    assert harness.sandboxes.open_now == 0


@OVER_BOTH
def test_a_fix_is_proven_fail_to_pass_with_no_regression(harness: Harness) -> None:
    out = harness.run(fix_inputs(harness), {"fix": steps("fix")})

    verdict = out.output["proof"]
    assert verdict["passed"] is True, verdict["reason"]
    assert verdict["fail_to_pass"] == [REPRO_ID]
    assert (verdict["still_failing"], verdict["passed_before"], verdict["pass_to_fail"]) == (
        [], [], []
    )  # fmt: skip
    assert verdict["suite_before"] == {"passed": 2, "failed": 3}
    assert verdict["suite_after"] == {"passed": 5, "failed": 0}
    assert verdict["diff_stat"].splitlines() == [
        "shopcart/cart.py | +4 -1", "tests/test_empty_cart_checkout.py | +15 -0"
    ]  # fmt: skip
    logs = harness.artifacts.data
    assert "ZeroDivisionError" in logs["proof-before.log"].decode()
    assert "Ran 5 tests" in logs["proof-after.log"].decode()


WEAKENED = {
    "call": {"name": "edit_file", "args": {"path": "tests/test_empty_cart_checkout.py",
             "old_text": 'summary(Cart())["average_price_cents"], 0)',
             "new_text": 'Cart().total_cents(), 0)'}},
}  # fmt: skip
"""A "fix" that makes the reproducing test pass by no longer testing the reported failure."""
REGRESSING = {
    "call": {"name": "edit_file", "args": {"path": "shopcart/cart.py",
             "old_text": "        return self.total_cents() // self.item_count()\n",
             "new_text": "        return 0\n"}},
}  # fmt: skip
"""A "fix" that makes the reproducing tests pass and breaks a test that passed."""


@pytest.mark.parametrize(
    ("change", "said", "field", "ids"),
    [
        (WEAKENED, f"the change weakens the tests: {REPRO_ID} failed when the reproduction ran",
         "passed_before", [REPRO_ID]),
        (REGRESSING, "1 tests that passed before fail with the change", "pass_to_fail",
         ["tests.test_cart.CartTest.test_average_price_rounds_down"]),
    ],
    ids=["test-passed-already", "regression"],
)  # fmt: skip
@OVER_BOTH
def test_a_fix_short_of_the_proof_is_not_handed_on(
    harness: Harness, change: dict[str, Any], said: str, field: str, ids: list[str]
) -> None:
    script = [change, steps("fix")[-1]]
    inputs = fix_inputs(harness)

    looped = harness.run(inputs, {"fix": script})  # the fixer's fix loops: a verdict to try again
    with pytest.raises(ProofFailedError, match=re.escape(said)):  # without a loop: the end
        harness.run(replace(inputs, spec=inputs.spec.model_copy(update={"loop": None})),
                    {"fix": script})  # fmt: skip

    verdict = looped.output["proof"]
    assert verdict["passed"] is False and said in verdict["reason"]
    assert verdict[field] == ids
    assert verdict["failure_tail"]  # what the next attempt is shown
    assert {"proof-before.log", "proof-after.log"} <= set(harness.artifacts.data)
    assert harness.sandboxes.open_now == 0


@OVER_BOTH
def test_a_fix_whose_tests_still_fail_keeps_its_evidence(harness: Harness) -> None:
    no_change = [steps("fix")[0], steps("fix")[-1]]
    inputs = fix_inputs(harness)
    once = replace(inputs, spec=inputs.spec.model_copy(update={"loop": None}))

    with pytest.raises(ProofFailedError, match="the reproducing tests still fail with the change"):
        harness.run(once, {"fix": no_change})

    assert {"tests-before.log", "tests-after.log", "test-log-1.txt", "proof-after.log"} <= set(
        harness.artifacts.data
    )
    assert harness.sinks.usage.requests == 2
    assert harness.sinks.usage.prompt_tokens_total > 0
    assert harness.sandboxes.open_now == 0


def cancel_on_call(n: int) -> tuple[Callable[[], None], list[int]]:
    """A fence that cancels the run at its `n`-th call (the calls are counted)."""
    return failing_at(n, StageCancelledError)


def test_a_cancel_stops_the_stage_at_its_next_safe_point(harness: Harness) -> None:
    fence, calls = cancel_on_call(3)  # model call, tool call, then the second model call

    with pytest.raises(StageCancelledError):
        harness.run(harness.inputs("search"), {"search": steps("search")}, fence=fence)

    assert calls == [1, 2, 3]
    assert len(harness.fake.requests()) == 1
    assert harness.sandboxes.open_now == 0


@OVER_BOTH
def test_a_cancel_right_before_publishing_pushes_nothing(harness: Harness) -> None:
    diff = demo_fix_diff(harness.names)
    # Safe points of the pr stage: model, show_diff, model, publish; then publish's own fence.
    fence, calls = cancel_on_call(5)

    with pytest.raises(StageCancelledError):
        harness.run(harness.inputs("pr", upstream_diff=diff), {"pr": steps("pr")}, fence=fence)

    assert calls == [1, 2, 3, 4, 5]
    assert harness.branches() == ["main"]
    assert "published.json" not in harness.artifacts.data


@OVER_BOTH
def test_a_pr_stage_publishes_and_reports_the_branch_it_measured(harness: Harness) -> None:
    diff = demo_fix_diff(harness.names)
    claims = {**output_of("pr"), "branch": "made-up", "commit": "0" * 40}
    pr = [*steps("pr")[:-1], {"json": claims}]

    out = harness.run(
        harness.inputs("pr", upstream_diff=diff, evidence="Verified by Baton: 3 passed"),
        {"pr": pr},
    )

    assert out.output["branch"] == "baton/r1"
    assert "baton/r1" in harness.branches()
    pushed = Git()("log", "-1", "--format=%H%n%B", "baton/r1", cwd=harness.remote)
    assert pushed.splitlines()[0] == out.output["commit"]
    assert "Verified by Baton: 3 passed" in pushed


def test_an_upstream_change_that_does_not_apply_fails_the_stage(harness: Harness) -> None:
    broken = "--- a/shopcart/cart.py\n+++ b/shopcart/cart.py\n@@ -1,1 +1,1 @@\n-nope\n+nada\n"

    with pytest.raises(StageError, match="the changes of an earlier stage do not apply"):
        harness.run(harness.inputs("pr", upstream_diff=broken), {"pr": steps("pr")})
    assert harness.fake.requests() == []


def test_thinking_counts_as_output_as_the_reply_s_usage_says(harness: Harness) -> None:
    harness.run(harness.inputs("triage"), {"triage": steps("triage")})

    usage = harness.fake.requests()[0]
    assert usage["thoughts_tokens"] > 0
    assert (
        harness.sinks.usage.output_tokens == usage["candidates_tokens"] + usage["thoughts_tokens"]
    )


def test_kept_requests_are_what_the_server_received_one_per_model_call(harness: Harness) -> None:
    harness.sinks = StageSinks(artifacts=harness.artifacts, audit=harness.audit.extend,
                               requests=[])  # fmt: skip
    harness.run(harness.inputs("search"), {"search": steps("search")})

    kept, received = harness.sinks.requests or [], harness.fake.requests()
    assert [(r["agent"], r["number"]) for r in kept] == [
        ("search", n) for n in range(1, len(received) + 1)
    ]
    assert [len(r["contents"]) for r in kept] == [
        len(entry["request"]["contents"]) for entry in received
    ]
    assert ISSUE in kept[0]["config"]["system_instruction"]
    json.dumps(kept)  # JSON-ready, as the artifact stores it

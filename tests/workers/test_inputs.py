"""What a stage execution reads besides upstream outputs: the change under review, cut to its
budget, and the run as a host tool is told of it."""

from __future__ import annotations

import hashlib

from orchestrator.core.models import (
    ArtifactRef,
    Issue,
    IssueSource,
    Iteration,
    RunRecord,
    StageRecord,
)
from orchestrator.core.pipeline import CHANGE_KEY, PREVIOUS_ATTEMPT_KEY, load_pipeline
from orchestrator.core.tools import ToolRun
from orchestrator.pipelines.reviewer import SPEC
from workers.inputs import MAX_CHANGE_CHARS, StageInputs, change_text, newest_change, resolve
from workers.sandboxes import execution_labels
from workers.tools.code import DIFF_ARTIFACT

REVIEW = load_pipeline(str(SPEC)).stage("review")


def inputs(**over: object) -> StageInputs:
    values: dict[str, object] = {
        "run_id": "r1", "pipeline": "reviewer", "spec": REVIEW, "attempt": 2,
        "repo": "https://bot:ghp_secret@github.com/acme/shop.git", "commit": "c" * 40,
        "base": "b" * 40, "source": "pull_request", "source_id": "acme/shop#7",
        "state": {"issue": "Title: x"},
    }  # fmt: skip
    return StageInputs(**{**values, **over})  # type: ignore[arg-type]


def test_a_change_within_budget_is_given_whole_and_an_empty_one_says_so() -> None:
    diff = "diff --git a/x b/x\n+{braces} stay as they are\n"

    assert inputs().with_change(diff).state == {"issue": "Title: x", CHANGE_KEY: diff}
    assert change_text("  \n") == (
        "(the change is empty: the head and the base hold the same files)"
    )


def test_a_long_change_keeps_its_head_and_tail_and_says_how_much_was_cut() -> None:
    diff = "H" * 20_000 + "M" * 10_000 + "T" * 20_000

    shown = change_text(diff)

    half = MAX_CHANGE_CHARS // 2
    assert shown.startswith("H" * half) and shown.endswith("T" * half)
    assert f"[… {len(diff) - 2 * half:,} characters of the diff cut here" in shown
    assert "M" not in shown  # the middle is what was cut


def test_a_tool_is_told_the_run_without_the_credentials_of_its_url() -> None:
    assert inputs().tool_run() == ToolRun(
        run_id="r1", pipeline="reviewer", stage="review",
        repo="https://***@github.com/acme/shop.git", commit="c" * 40, base="b" * 40,
        source="pull_request", source_id="acme/shop#7",
    )  # fmt: skip


def test_a_branch_execution_is_labelled_and_sandboxed_apart_from_its_siblings() -> None:
    stage, branch = inputs(), inputs(branch="b2")
    assert stage.labels == {"branch": "reviewer.review", "session": "r1:review:2",
                            "stage": "review"}  # fmt: skip
    assert branch.labels == {"branch": "reviewer.review.b2", "session": "r1:review:b2:2",
                             "stage": "review"}  # fmt: skip
    assert execution_labels(branch.held, branch.attempt) == {
        "baton.run": "r1", "baton.stage": "review", "baton.branch": "b2", "baton.attempt": "2",
    }  # fmt: skip
    assert "baton.branch" not in execution_labels(stage.held, stage.attempt)


class _Outputs:
    """What `resolve` reads of a run's store: outputs by key and artifacts by reference."""

    def __init__(self, outputs: dict[str, dict[str, object]], diff: bytes) -> None:
        self._outputs, self._diff = outputs, diff

    def outputs(self, run_id: str, wanted: list[str]) -> dict[str, object]:
        return {key: self._outputs[key] for key in wanted if key in self._outputs}

    def output(self, run_id: str, key: str) -> dict[str, object] | None:
        return self._outputs.get(key)

    def artifact(self, ref: ArtifactRef) -> bytes:
        assert ref.name == DIFF_ARTIFACT
        return self._diff


def test_a_fix_sent_back_by_its_review_is_told_the_reviews_words_and_the_review_reads_it() -> None:
    fixer = load_pipeline("fixer")
    diff = b"diff --git a/m.py b/m.py\n-    return total // count\n+    if count == 5: return 7\n"
    ref = ArtifactRef(run_id="r1", name=DIFF_ARTIFACT, size_bytes=len(diff),
                      sha256=hashlib.sha256(diff).hexdigest())  # fmt: skip
    run = RunRecord(id="r1", pipeline="fixer", repo="/r", commit="c", idempotency_key="r1",
                    issue=Issue(source=IssueSource.TEXT, title="crash", body="boom"))  # fmt: skip
    why = "review refused it: it special-cases the test's input"
    run.stages["fix"] = StageRecord(iteration=2, artifacts={DIFF_ARTIFACT: ref}, iterations=[
        Iteration(number=1, attempt=1, passed=False, reason=why)
    ])  # fmt: skip
    proof = {"passed": True, "reason": "", "reproducing_command": "python -m pytest t.py"}
    said = {"summary": "handled an empty cart", "proof": proof}
    plan = {"test_command": "python -m pytest t.py", "files_to_change": ["m.py"]}
    reproduction = {"test_files": ["t.py"], "test_command": "python -m pytest t.py",
                    "expected_failure": "ZeroDivisionError", "explanation": "divides by 0",
                    "reproduced": {"command": "python -m pytest t.py", "exit_code": 1,
                                   "expected_failure_seen": True}}  # fmt: skip
    store = _Outputs({"fix": said, "plan": plan, "search": {}, "reproduce": reproduction}, diff)

    fix = resolve(run, fixer, fixer.stage("fix"), 3, store)  # type: ignore[arg-type]
    review = resolve(run, fixer, fixer.stage("review"), 2, store)  # type: ignore[arg-type]

    told = fix.state[PREVIOUS_ATTEMPT_KEY]
    assert told.startswith(f"Your previous attempt (iteration 1 of 3) was not accepted: {why}")
    assert "It said of itself: handled an empty cart" in told
    assert review.base is None and CHANGE_KEY in fixer.stage("review").inputs
    assert CHANGE_KEY not in review.state  # read by the execution: the newest change made
    assert newest_change(run, fixer, fixer.stage("review"), store) == diff.decode()  # type: ignore[arg-type]
    assert newest_change(run, fixer, fixer.stage("fix"), store) is None  # type: ignore[arg-type]


def test_the_pull_request_says_the_review_judged_the_change_or_that_a_person_overrode_it() -> None:
    fixer = load_pipeline("fixer")
    run = RunRecord(id="r1", pipeline="fixer", repo="/r", commit="c", idempotency_key="r1",
                    issue=Issue(source=IssueSource.TEXT, title="crash", body="boom"))  # fmt: skip
    proof = {"passed": True, "reason": "", "reproducing_command": "python -m pytest t.py",
             "fail_to_pass": ["t.py::test_empty"]}  # fmt: skip
    plan = {"test_command": "python -m pytest t.py", "files_to_change": ["m.py"]}
    fix = {"summary": "s", "proof": proof}
    approved = {"reproduces_report": True, "fixes_cause": True, "problems": []}
    refused = {"reproduces_report": True, "fixes_cause": False, "problems": ["special case"]}

    def evidence(review: dict[str, object] | None) -> str:
        outputs = {"triage": {}, "fix": fix, "plan": plan, "reproduce": {"test_files": ["t.py"]}}
        store = _Outputs(outputs | ({"review": review} if review else {}), b"")
        return resolve(run, fixer, fixer.stage("pr"), 1, store).evidence  # type: ignore[arg-type]

    assert evidence(approved).endswith(
        "fail without the change's code and pass with it\n"
        "- reviewed in a fresh session by stage `review`: `reproduces_report` and "
        "`fixes_cause` hold"
    )
    assert evidence(refused).endswith(
        "- stage `review` refused it (special case); a person approved it at the gate"
    )
    assert "review" not in evidence(None)

"""What a stage execution reads besides upstream outputs: the change under review, cut to its
budget, and the run as a host tool is told of it."""

from __future__ import annotations

from orchestrator.core.pipeline import CHANGE_KEY, load_pipeline
from orchestrator.core.tools import ToolRun
from orchestrator.pipelines.reviewer import SPEC
from workers.inputs import MAX_CHANGE_CHARS, StageInputs, change_text
from workers.sandboxes import execution_labels

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

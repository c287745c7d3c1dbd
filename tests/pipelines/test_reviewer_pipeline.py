"""The reviewer pipeline as a spec: it loads, its stages have queues of their own, it reads the
change under review, and its schemas hold what they promise."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.core.facts import Fact, measured_fields
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.tools import HostTool
from orchestrator.pipelines.reviewer import SPEC
from orchestrator.pipelines.reviewer.schemas import (
    MAX_COMMENT_CHARS,
    MAX_COMMENTS,
    Review,
    ReviewComment,
    TestReport,
)

COMMENT = {"path": "shopcart/cart.py", "line": 39, "severity": "high", "text": "Off by one."}


def test_the_reviewer_loads_with_its_own_queues_and_reads_the_change() -> None:
    pipeline = load_pipeline(str(SPEC))

    assert pipeline.name == "reviewer"
    assert [(s.name, s.queue) for s in pipeline.stages] == [
        ("summarise", "baton.reviewer.summarise"), ("inspect", "baton.reviewer.inspect"),
        ("test", "baton.reviewer.test"), ("review", "baton.reviewer.review"),
    ]  # fmt: skip
    assert pipeline.reads_change
    assert [s.name for s in pipeline.stages if "change" in s.inputs] == [
        "summarise",
        "inspect",
        "review",
    ]
    assert pipeline.stage("review").tools == ("post_review",)
    assert not load_pipeline("fixer").reads_change


def test_the_post_review_tool_s_token_and_address_come_from_the_worker_s_environment() -> None:
    declaration = load_pipeline(str(SPEC)).tools["post_review"]

    assert isinstance(declaration, HostTool)
    assert declaration.secrets == {"token": "BATON_GITHUB_TOKEN"}
    assert declaration.environment == {"api_url": "BATON_GITHUB_API_URL"}


def test_the_tests_of_the_test_stage_are_baton_s_measurement() -> None:
    assert measured_fields(TestReport) == {Fact.TESTS_BEFORE: "tests"}
    assert load_pipeline(str(SPEC)).stage("test").verify is not None


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"line": 0}, "line"),
        ({"severity": "blocker"}, "severity"),
        ({"text": ""}, "text"),
        ({"text": "x" * (MAX_COMMENT_CHARS + 1)}, "text"),
        ({"path": ""}, "path"),
        ({"column": 3}, "column"),
    ],
)
def test_a_comment_holds_a_file_a_line_a_severity_and_a_text(
    over: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        ReviewComment.model_validate({**COMMENT, **over})

    assert [error["loc"] for error in refused.value.errors()] == [(field,)]


def test_a_review_has_a_body_and_at_most_its_share_of_comments() -> None:
    Review.model_validate({"body": "b", "comments": [COMMENT] * MAX_COMMENTS, "posted": True})
    with pytest.raises(ValidationError, match="comments"):
        Review.model_validate(
            {"body": "b", "comments": [COMMENT] * (MAX_COMMENTS + 1), "posted": True}
        )
    with pytest.raises(ValidationError, match="body"):
        Review.model_validate({"body": "", "comments": [], "posted": False})

from __future__ import annotations

import pytest

from orchestrator.pipelines.fixer.schemas import Plan, Triage
from workers.budget import json_chars
from workers.errors import StageOutputError
from workers.output import parse, repair_message, truncate_to_budget

TRIAGE = '{"actionable": true, "reason": "r", "severity": "low", "error_summary": "e"}'


@pytest.mark.parametrize("text", [TRIAGE, f"```json\n{TRIAGE}\n```", f"  ```\n{TRIAGE}```  "])
def test_reply_parses_with_or_without_a_fence(text: str) -> None:
    assert parse(text, Triage) == {
        "actionable": True,
        "reason": "r",
        "severity": "low",
        "error_summary": "e",
        "suspected_files": [],
        "keywords": [],
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the reply was empty"),
        ("I think it is a bug.", "does not match Triage: (reply): Invalid JSON"),
        ('{"actionable": "maybe"}', "actionable: Input should be a valid boolean"),
        (
            '{"actionable": true, "reason": "r", "severity": "urgent", "error_summary": "e"}',
            "severity: Input should be",
        ),
    ],
)
def test_invalid_replies_name_what_was_wrong(text: str, message: str) -> None:
    with pytest.raises(StageOutputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text, Triage)


def test_repair_message_carries_the_errors() -> None:
    error = StageOutputError("the reply does not match Triage: severity: bad")
    assert "severity: bad" in repair_message(error)
    assert "only the JSON object" in repair_message(error)


def test_over_budget_output_is_cut_with_markers_and_still_valid() -> None:
    plan = {
        "approach": "a" * 5_000,
        "steps": ["s" * 300] * 20,
        "files_to_change": ["x.py"],
        "test_command": "t",
    }
    cut = truncate_to_budget(plan, Plan, 1_500)

    assert json_chars(cut) <= 1_500
    assert Plan.model_validate(cut)
    assert "…[cut " in cut["approach"]
    assert cut["files_to_change"] == ["x.py"]

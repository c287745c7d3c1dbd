"""A stage's `delegate` table (`orchestrator.core.delegation`): what loads, and what is refused
with a message naming the file, the stage and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.delegation import DelegateRule
from orchestrator.core.errors import PipelineError
from orchestrator.core.pipeline import load_pipeline

HEAD = """
name = "mine"

[tools.note]
kind = "host"
function = "tests.workers.test_delegate:read_note"

[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "x"
"""


def spec(tmp_path: Path, stage: str, tools: str = "") -> str:
    path = tmp_path / "mine.toml"
    path.write_text(HEAD + stage + tools)
    return str(path)


def test_a_stage_naming_delegate_without_a_table_gets_the_defaults(tmp_path: Path) -> None:
    [stage] = load_pipeline(spec(tmp_path, 'tools = ["delegate", "note"]\n')).stages

    assert stage.delegate == DelegateRule()
    assert (stage.delegate.max_depth, stage.delegate.max_children) == (2, 3)
    assert stage.delegate.tools == ()


def test_a_configured_delegation_loads_as_written(tmp_path: Path) -> None:
    table = (
        'tools = ["delegate", "note"]\n'
        'delegate = { max_depth = 3, max_children = 1, tools = ["note", "delegate"], '
        'budget = { max_model_calls = 2, max_summary_chars = 500 }, instruction = "Be brief." }\n'
    )
    [stage] = load_pipeline(spec(tmp_path, table)).stages

    assert stage.delegate is not None
    assert (stage.delegate.max_depth, stage.delegate.max_children) == (3, 1)
    assert stage.delegate.tools == ("note", "delegate")
    assert (stage.delegate.budget.max_model_calls, stage.delegate.budget.max_summary_chars) == (
        2,
        500,
    )
    assert stage.delegate.instruction == "Be brief."


@pytest.mark.parametrize(
    ("stage", "said"),
    [
        (
            'tools = ["note"]\ndelegate = { max_depth = 1 }\n',
            "stage 'search' has a `delegate` table but no `delegate` in its tools",
        ),
        (
            'tools = ["delegate"]\ndelegate = { tools = ["note"] }\n',
            "stage 'search': delegate.tools ['note'] are not among the stage's tools",
        ),
        ('tools = ["delegate"]\ndelegate = { max_depth = 9 }\n', "delegate.max_depth"),
        ('tools = ["delegate"]\ndelegate = { max_children = 0 }\n', "delegate.max_children"),
        ('tools = ["delegate"]\ndelegate = { depth = 2 }\n', "delegate.depth"),
    ],
)
def test_a_bad_delegation_is_refused_naming_the_stage_and_field(
    tmp_path: Path, stage: str, said: str
) -> None:
    path = spec(tmp_path, stage)

    with pytest.raises(PipelineError) as refused:
        load_pipeline(path)

    assert str(refused.value).startswith(f"{path} is invalid")
    assert said in str(refused.value)


def test_a_declared_tool_may_not_take_the_name_delegate(tmp_path: Path) -> None:
    declared = (
        '\n[tools.delegate]\nkind = "host"\nfunction = "tests.workers.test_delegate:read_note"\n'
    )

    with pytest.raises(PipelineError, match=r"delegate.*name of a built-in tool"):
        load_pipeline(spec(tmp_path, 'tools = ["delegate"]\n', declared))

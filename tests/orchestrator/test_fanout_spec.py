"""A fan-out stage's spec (`parallel`, `map`, `select`) is checked when the pipeline loads, and
a branch's names follow one format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from orchestrator.core import branches
from orchestrator.core.errors import PipelineError
from orchestrator.core.pipeline import Pipeline, load_pipeline
from orchestrator.core.tools import BUILTIN_TOOLS

SCHEMAS = "orchestrator.pipelines.fixer.schemas"
REPRODUCE = {"command_from": "test_command", "test_files_from": "test_files",
             "expected_failure_from": "expected_failure"}  # fmt: skip
CODE_TOOLS = ["read_file", "edit_file"]


class Pick(BaseModel):
    """A judge's output: the branch it keeps, and why."""

    branch: str
    why: str


class Count(BaseModel):
    """A judge's output whose field names no branch."""

    branch: int


def _fixer_like(**fix: object) -> dict[str, object]:
    """search → reproduce → fix (with its proof) → after; `fix` overrides the fix stage."""
    stages: list[dict[str, object]] = [
        {"name": "search", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Search"},
        {"name": "reproduce", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Reproduction",
         "tools": CODE_TOOLS, "reproduce": REPRODUCE},
        {"name": "fix", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Fix",
         "tools": CODE_TOOLS, "proof": {"reproduction_from": "reproduce"}, **fix},
        {"name": "after", "instruction": "{fix}", "output_schema": f"{SCHEMAS}:Plan"},
    ]  # fmt: skip
    return {"name": "p", "stages": stages}


def test_best_of_three_selected_by_proof_loads() -> None:
    stage = Pipeline.model_validate(_fixer_like(parallel=3, select="proof")).stage("fix")
    assert stage.fans_out and stage.parallel == 3
    assert stage.select is not None and stage.select.by_facts


def test_a_map_over_an_upstream_list_loads_gathering_or_selecting() -> None:
    spec = _fixer_like(map="search.locations", instruction="look at {item} {issue}")
    gathering = Pipeline.model_validate(spec).stage("fix")
    assert gathering.fans_out and gathering.select is None and gathering.inputs == ["item", "issue"]
    spec = _fixer_like(map="search.locations", select="proof", instruction="{item}")
    assert Pipeline.model_validate(spec).stage("fix").select is not None


def test_a_judge_right_after_loads() -> None:
    spec = _fixer_like(parallel=2, select={"judge": "after", "field": "branch"})
    spec["stages"][-1]["output_schema"] = f"{__name__}:Pick"  # type: ignore[index]
    select = Pipeline.model_validate(spec).stage("fix").select
    assert select is not None and (select.judge, select.field) == ("after", "branch")


def test_a_branch_may_read_its_own_id_to_vary_what_it_tries() -> None:
    spec = _fixer_like(parallel=3, select="proof", instruction="candidate {branch}: {issue}")
    assert Pipeline.model_validate(spec).stage("fix").inputs == ["branch", "issue"]


def test_a_stage_without_fan_out_fields_does_not_fan_out() -> None:
    assert not any(stage.fans_out for stage in load_pipeline("fixer").stages)


@pytest.mark.parametrize(
    ("fix", "message"),
    [
        ({"parallel": 1, "select": "proof"},
         "stage 'fix': parallel is 1; it must be from 2 to 10"),
        ({"parallel": 11, "select": "proof"},
         "stage 'fix': parallel is 11; it must be from 2 to 10"),
        ({"parallel": 3}, "stage 'fix' runs 3 branches in parallel and needs a `select`"),
        ({"parallel": 2, "map": "search.locations", "select": "proof"},
         "stage 'fix' has both `parallel` and `map`; give one"),
        ({"select": "proof"}, "stage 'fix' has `select` but does not fan out"),
        ({"parallel": 2, "select": "best"}, "select is \"proof\" or"),
        ({"parallel": 2, "select": {"field": "branch"}}, "a select table names its judge and"),
        ({"parallel": 2, "select": {"judge": "after"}},
         'select = { judge = "<stage>", field = "<field>" }'),
        ({"parallel": 2, "select": {"judge": "after", "field": "branch", "by": "x"}}, "select.by"),
        ({"parallel": 2, "select": "proof", "loop": {"until": "tests_passed"}},
         "stage 'fix' fans out and loops"),
        ({"parallel": 2, "select": "proof", "tools": ["edit_file", "publish"]},
         "stage 'fix' fans out and has the `publish` tool: every branch would publish"),
        ({"map": "search.root_cause"},
         "stage 'fix': map names 'search.root_cause', which must hold a list, not str"),
        ({"map": "search.nowhere"},
         "stage 'fix': map names 'search.nowhere', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Search has no field 'nowhere'"),
        ({"map": "later.items"}, "stage 'fix': map names 'later', which is no earlier stage's"),
        ({"map": "search"}, "stages.2.map"),
        ({"instruction": "{item}"}, "stage 'fix' references {item}, which only a stage with a "
         "`map` has"),
        ({"instruction": "try {branch}"}, "stage 'fix' references {branch}, which only a stage "
         "that fans out (`parallel` or `map`) has"),
        ({"parallel": 2, "select": {"judge": "search", "field": "branch"}},
         "stage 'fix': select.judge names 'search', which must be the stage right after it; "
         "the stage after it is 'after'"),
        ({"parallel": 2, "select": {"judge": "after", "field": "branch"}},
         "stage 'after': select.field of stage 'fix' names 'branch', but the output schema "
         "orchestrator.pipelines.fixer.schemas:Plan has no field 'branch'"),
    ],
)  # fmt: skip
def test_a_bad_fan_out_is_refused_naming_stage_and_field(
    fix: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Pipeline.model_validate(_fixer_like(**fix))


def test_selecting_by_proof_needs_the_stages_proof_rule() -> None:
    spec = _fixer_like(parallel=2, select="proof")
    del spec["stages"][2]["proof"]  # type: ignore[index]
    with pytest.raises(ValueError, match='selects by "proof" but has no `proof` rule'):
        Pipeline.model_validate(spec)


def test_a_judge_whose_field_holds_no_string_is_refused() -> None:
    spec = _fixer_like(parallel=2, select={"judge": "after", "field": "branch"})
    spec["stages"][-1]["output_schema"] = f"{__name__}:Count"  # type: ignore[index]
    with pytest.raises(ValueError, match="names 'branch', which must hold a string, not int"):
        Pipeline.model_validate(spec)


def test_a_judge_that_is_the_last_stage_is_refused() -> None:
    spec = _fixer_like(parallel=2, select={"judge": "after", "field": "branch"})
    spec["stages"].pop()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"select\.judge names 'after'.*it is the last stage"):
        Pipeline.model_validate(spec)


def test_a_spec_file_with_a_bad_fan_out_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "wide.toml"
    path.write_text(
        'name = "wide"\n[[stages]]\nname = "only"\ninstruction = "{issue}"\n'
        f'output_schema = "{SCHEMAS}:Plan"\nparallel = 20\nselect = "proof"\n'
    )
    with pytest.raises(PipelineError, match=r"wide\.toml(.|\n)*parallel is 20"):
        load_pipeline(str(path))


def test_a_branchs_names_follow_one_format() -> None:
    assert branches.branch_ids(3) == ["b1", "b2", "b3"]
    assert branches.branch_session_id("R", "fix", "b2", 1) == "R:fix:b2:1"
    assert branches.branch_label("fixer-plus", "fix", "b2") == "fixer-plus.fix.b2"
    assert branches.branch_task_id("R", "fix", "b2") == "R.fix.b2"
    assert branches.branch_task_name("fixer-plus", "fix", "b2") == "baton.fixer-plus.fix.b2"
    assert branches.branch_output_key("fix", "b2") == "fix#b2"


def test_the_tool_no_fan_out_stage_may_have_is_the_built_in_publish() -> None:
    assert branches.PUBLISH_TOOL in BUILTIN_TOOLS

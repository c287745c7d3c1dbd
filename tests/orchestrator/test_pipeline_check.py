"""`baton pipeline check` (and enqueue, which runs the same checks) on broken specs: each
problem names the file, the stage and the field, and the command exits 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.control.checks import check_pipeline
from orchestrator.control.cli import main

GOOD = """
name = "labeller"

[[stages]]
name = "triage"
output_schema = "orchestrator.pipelines.fixer.schemas:Triage"
instruction = "Triage {issue}"

[[stages]]
name = "label"
output_schema = "orchestrator.pipelines.fixer.schemas:Plan"
instruction = "Label {triage}"
"""

BROKEN = {
    "missing schema module": (
        ('"orchestrator.pipelines.fixer.schemas:Plan"', '"labeller_nowhere.schemas:Plan"'),
        "label", "output_schema", "No module named 'labeller_nowhere'",
    ),
    "class that does not exist": (
        ('fixer.schemas:Triage"', 'fixer.schemas:Label"'),
        "triage", "output_schema", "has no attribute 'Label'",
    ),
    "unknown key": (
        ("Label {triage}", "Label {triage} for {team}"),
        "label", "instruction",
        "{team} names no stage's output (known: {issue}, {change}, {triage}, {label}",
    ),
    "branch id in a stage that does not fan out": (
        ("Label {triage}", "Label {triage} as {branch}"),
        "label", "instruction", "{branch} names no stage's output",
    ),
    "key only a later stage produces": (
        ("Triage {issue}", "Triage {issue} as {label} says"),
        "triage", "instruction", "{label} is the output of stage 'label', which runs later",
    ),
    "unknown tool": (
        ('instruction = "Label', 'tools = ["read_file", "teleport"]\ninstruction = "Label'),
        "label", "tools", "tool 'teleport': is neither a built-in tool",
    ),
    "loop on a missing field": (
        ('instruction = "Label', 'loop = { until = "proof.passed" }\ninstruction = "Label'),
        "label", "loop", "has no field 'proof'",
    ),
    "bad budget": (
        ('instruction = "Label', "budget = { max_model_calls = 0 }\ninstruction = \"Label"),
        "label", "budget.max_model_calls", "greater than 0",
    ),
    "duplicate stage name": (
        ('name = "label"', 'name = "triage"\noutput_key = "label"'),
        "triage", "name", "another stage has this name",
    ),
    "malformed TOML": (
        ('name = "label"', 'name = "label'),
        None, None, "not valid TOML: ",
    ),
    "unknown model": (
        ('instruction = "Label', 'model = "openia/gpt-4.1-mini"\ninstruction = "Label'),
        "label", "model", "names an unknown provider 'openia'",
    ),
    "unknown field": (
        ('instruction = "Label', 'colour = "red"\ninstruction = "Label'),
        "label", "colour", "unknown field",
    ),
}  # fmt: skip


def spec(tmp_path: Path, replace: tuple[str, str]) -> Path:
    old, new = replace
    assert old in GOOD
    path = tmp_path / "labeller.toml"
    path.write_text(GOOD.replace(old, new, 1))
    return path


def test_the_good_spec_passes(tmp_path: Path) -> None:
    path = tmp_path / "labeller.toml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["pipeline", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "pipeline 'labeller'" in result.output and "is valid: triage, label" in result.output


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_spec_is_refused_naming_its_file_stage_and_field(
    case: str, tmp_path: Path
) -> None:
    replace, stage, field, said = BROKEN[case]
    path = spec(tmp_path, replace)

    result = CliRunner().invoke(main, ["pipeline", "check", str(path)])

    assert result.exit_code == 2, result.output
    where = ", ".join(
        [str(path)]
        + ([f"stage {stage!r}"] if stage else [])
        + ([f"field {field!r}"] if field else [])
    )
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"error: {where}: "), lines
    assert said in lines[0]
    [problem] = check_pipeline(str(path)).problems  # one problem, and only the one
    assert (problem.stage, problem.field) == (stage, field)


def test_malformed_toml_is_told_by_its_line(tmp_path: Path) -> None:
    path = spec(tmp_path, BROKEN["malformed TOML"][0])
    [problem] = check_pipeline(str(path)).problems
    assert "(at line 10, column 14)" in problem.message  # `name = "label` is line 10


def test_several_problems_are_all_said(tmp_path: Path) -> None:
    path = tmp_path / "labeller.toml"
    path.write_text(
        GOOD.replace("Label {triage}", "Label {tags}").replace(
            'fixer.schemas:Triage"', 'fixer.schemas:Nope"'
        )
    )
    problems = check_pipeline(str(path)).problems
    assert [(p.stage, p.field) for p in problems] == [
        ("triage", "output_schema"),
        ("label", "instruction"),
    ]


BEST_OF_TWO = """
name = "best2"

[[stages]]
name = "reproduce"
output_schema = "orchestrator.pipelines.fixer.schemas:Reproduction"
tools = ["edit_file"]
reproduce = { command_from = "test_command", test_files_from = "test_files", expected_failure_from = "expected_failure" }
instruction = "Reproduce {issue}"

[[stages]]
name = "fix"
output_schema = "orchestrator.pipelines.fixer.schemas:Fix"
tools = ["edit_file"]
parallel = 2
select = "proof"
proof = { reproduction_from = "reproduce" }
instruction = "You are candidate {branch}. Fix what {reproduce} shows."
"""  # noqa: E501


def test_a_fan_out_stage_may_read_its_branch_id(tmp_path: Path) -> None:
    path = tmp_path / "best2.toml"
    path.write_text(BEST_OF_TWO)
    assert check_pipeline(str(path)).problems == []


LITELLM_STAGE = GOOD.replace(
    'instruction = "Label', 'model = "openai/gpt-4.1-mini"\ninstruction = "Label'
)


def test_a_litellm_stage_where_litellm_is_not_installed_is_refused_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "labeller.toml"
    spec.write_text(LITELLM_STAGE)
    monkeypatch.setitem(sys.modules, "litellm", None)  # what an install without the extra has

    checked = check_pipeline(str(spec))

    assert [(p.stage, p.field) for p in checked.problems] == [("label", "model")]
    assert "pip install 'baton[litellm]'" in checked.problems[0].message


def test_control_the_same_litellm_stage_passes_where_litellm_is_installed(tmp_path: Path) -> None:
    spec = tmp_path / "labeller.toml"
    spec.write_text(LITELLM_STAGE)

    checked = check_pipeline(str(spec))

    assert checked.problems == []

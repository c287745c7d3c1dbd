"""`baton pipeline show` spells out each stage's gate and fan-out and the pipeline's
`[autonomy]` and `[run_budget]`, as text and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from orchestrator.control.cli import main
from orchestrator.control.pipeline_rules import autonomy_lines
from orchestrator.core.autonomy import Autonomy

from .test_cli_inspect import HOSTILE, _no_control, rendered

FIXER = "orchestrator.pipelines.fixer.schemas"
SPEC = f"""
name = "graphy"

[run_budget]
tokens = 200000
calls = 40

[autonomy]
score = "triage.fixability"
levels = [
  {{ min_score = 0.8 }},
  {{ min_score = 0.5, gate_before = "pr" }},
  {{ min_score = 0.2, stop_after = "plan" }},
]
[autonomy.repos."/srv/git/payments"]
levels = [{{ min_score = 0.0, gate_before = "pr" }}]

[[stages]]
name = "triage"
instruction = "{{issue}}"
output_schema = "tests.orchestrator.test_autonomy:Scored"

[[stages]]
name = "plan"
instruction = "{{issue}}"
output_schema = "{FIXER}:Plan"
gate = {{ approve = "plan", timeout_s = 3600, on_timeout = "escalate" }}

[[stages]]
name = "reproduce"
instruction = "{{issue}}"
output_schema = "{FIXER}:Reproduction"
tools = ["read_file", "edit_file"]
[stages.reproduce]
command_from = "test_command"
test_files_from = "test_files"
expected_failure_from = "expected_failure"

[[stages]]
name = "fix"
instruction = "{{plan}}"
output_schema = "{FIXER}:Fix"
tools = ["read_file", "edit_file"]
proof = {{ reproduction_from = "reproduce" }}
parallel = 3
select = "proof"

[[stages]]
name = "pr"
instruction = "{{fix}}"
output_schema = "{FIXER}:Plan"
"""


def a_spec(tmp_path: Path) -> str:
    path = tmp_path / "graphy.toml"
    path.write_text(SPEC)
    return str(path)


def test_show_names_each_stage_s_gate_and_fan_out_and_the_pipeline_s_rules(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(main, ["pipeline", "show", a_spec(tmp_path)], terminal_width=200)

    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.output.splitlines()]
    assert "plan ← {issue} (gate: approve plan, timeout 3600s then escalate)" in lines
    assert "fix ← {plan} (3 branches in parallel, select by proof)" in lines
    assert "run budget: tokens=200000,calls=40" in lines
    at = lines.index("autonomy by triage.fixability:")
    assert lines[at + 1 : at + 6] == [
        "≥ 0.8: goes all the way",
        "≥ 0.5: a person approves before pr",
        "≥ 0.2: stops after plan",
        "in /srv/git/payments:",
        "≥ 0: a person approves before pr",
    ]


def test_show_json_carries_the_gate_fan_out_autonomy_and_run_budget(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["pipeline", "show", a_spec(tmp_path), "--json"])

    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    stages = {stage["name"]: stage for stage in shown["stages"]}
    assert stages["plan"]["gate"] == {"approve": "plan", "timeout_s": 3600.0,
                                      "on_timeout": "escalate"}  # fmt: skip
    assert (stages["fix"]["parallel"], stages["fix"]["select"], stages["fix"]["map"]) == (
        3, "proof", None,
    )  # fmt: skip
    assert stages["triage"]["gate"] is None and stages["triage"]["select"] is None
    assert shown["run_budget"] == {"tokens": 200000, "calls": 40}
    assert shown["autonomy"]["score"] == "triage.fixability"
    assert shown["autonomy"]["levels"][1] == {"min_score": 0.5, "stop_after": None,
                                              "gate_before": "pr"}  # fmt: skip


def test_a_pipeline_without_rules_says_it_sets_no_run_budget() -> None:
    result = CliRunner().invoke(main, ["pipeline", "show", "fixer"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "run budget: none (enqueue --budget sets one per run)" in result.output
    assert "autonomy" not in result.output
    shown = json.loads(CliRunner().invoke(main, ["pipeline", "show", "fixer", "--json"]).output)
    assert (shown["autonomy"], shown["run_budget"]) == (None, None)


def test_a_hostile_repository_name_in_the_autonomy_rule_is_shown_escaped() -> None:
    rule = Autonomy.model_validate({
        "score": "triage.fixability", "levels": [{"min_score": 0.0}],
        "repos": {HOSTILE: {"levels": [{"min_score": 0.0, "stop_after": "plan"}]}},
    })  # fmt: skip
    shown = rendered("\n".join(autonomy_lines(rule)), 200)
    assert _no_control(shown) and "\\x1b]0;owned" in shown

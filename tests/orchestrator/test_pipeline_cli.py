"""`baton pipeline show` and `new`: what a pipeline author sees and starts from."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from orchestrator.control.cli import main

FIXER_SPEC = Path(__file__).resolve().parents[2] / "orchestrator/pipelines/fixer/pipeline.toml"
FIXER = ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]


def test_show_json_lists_each_stage_with_its_queue_tools_model_and_loop() -> None:
    result = CliRunner().invoke(main, ["pipeline", "show", "fixer", "--json"])

    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["name"] == "fixer" and len(shown["digest"]) == 64
    assert [s["name"] for s in shown["stages"]] == FIXER
    assert [s["queue"] for s in shown["stages"]] == [f"baton.fixer.{name}" for name in FIXER]
    fix = shown["stages"][FIXER.index("fix")]
    assert fix["loop"] == "until proof.passed, at most 3"
    assert "edit_file" in fix["tools"] and fix["model"] == "default"
    assert shown["stages"][0]["stop"] == "stops the run when actionable = False"
    review = shown["stages"][FIXER.index("review")]
    assert review["send_back"] == (
        "sends the run back to fix unless reproduces_report and fixes_cause"
    )
    assert review["tools"] == [] and fix["send_back"] is None


def test_show_draws_the_table_and_the_graph_as_text() -> None:
    result = CliRunner().invoke(main, ["pipeline", "show", "fixer"], terminal_width=120)

    assert result.exit_code == 0, result.output
    assert "baton.fixer.reproduce" in result.output
    assert "issue → triage → search → plan → reproduce → fix ⟲ → review ↩ fix → pr" in result.output
    assert "search     ← {triage} {issue}" in result.output


def test_show_names_every_tool_of_a_stage_whole_in_80_columns() -> None:
    tools = {s["name"]: s.get("tools", []) for s in tomllib.loads(FIXER_SPEC.read_text())["stages"]}
    result = CliRunner().invoke(main, ["pipeline", "show", "fixer"], terminal_width=80)

    assert result.exit_code == 0, result.output
    cells = re.findall(r"│ *([a-z_]+) *│", result.output)
    assert set(tools["fix"]) | set(tools["reproduce"]) <= set(cells)


def test_show_of_a_broken_spec_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nstages = []\n')
    result = CliRunner().invoke(main, ["pipeline", "show", str(path)])
    assert result.exit_code == 2
    assert f"error: {path}: " in result.output and "at least one stage" in result.output


def test_new_writes_a_package_and_refuses_a_bad_name_or_an_existing_folder(tmp_path: Path) -> None:
    made = CliRunner().invoke(main, ["pipeline", "new", "notes", "--dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    files = sorted(p.name for p in (tmp_path / "notes").iterdir())
    assert files == ["__init__.py", "pipeline.toml", "scenario.json", "schemas.py"]
    assert (
        'output_schema = "notes.schemas:Summary"' in (tmp_path / "notes/pipeline.toml").read_text()
    )
    # `--repo .` needs a git repository with a commit: the steps it prints make one first.
    steps = made.output.splitlines()
    repo = next(i for i, line in enumerate(steps) if "git init" in line and " commit -qm" in line)
    assert repo < next(i for i, line in enumerate(steps) if "baton enqueue" in line)

    again = CliRunner().invoke(main, ["pipeline", "new", "notes", "--dir", str(tmp_path)])
    assert again.exit_code == 2 and "exists already" in again.output
    bad = CliRunner().invoke(main, ["pipeline", "new", "Release-Notes", "--dir", str(tmp_path)])
    assert bad.exit_code == 2 and "lowercase letters, digits and _" in bad.output

"""`baton pipeline check|show|new`: see a pipeline and what is wrong with it before any run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.markup import escape
from rich.text import Text

from orchestrator.control.checks import Checked, check_pipeline
from orchestrator.control.pipeline_rules import (
    autonomy_lines,
    budget_text,
    fan_text,
    gate_text,
    pipeline_rules_json,
    stage_rules_json,
)
from orchestrator.control.scaffold import SCENARIO_FILE, SPEC_FILE, scaffold
from orchestrator.control.tables import Column, fitted_table
from orchestrator.core.pipeline import Pipeline, StageSpec
from orchestrator.core.settings import Settings

EXIT_BAD_INPUT = 2
DEFAULT_MODEL = "default"
"""How `show` names the model of a stage that names none: the worker's `BATON_MODEL`."""

out = Console()
err = Console(stderr=True)


@click.group()
def pipeline() -> None:
    """Check, show and scaffold pipeline specs (a TOML file, or an installed pipeline's name)."""


@pipeline.command()
@click.argument("spec")
def check(spec: str) -> None:
    """Check SPEC as enqueue will: every field known and valid, every schema imports, every
    {key} names an earlier stage's output, every tool and model resolves, every stage fits the
    visibility timeout. Each problem names the file, the stage and the field; exit 2 if any."""
    checked = _checked(spec)
    found = checked.valid() if not checked.problems else None
    if found is None:
        for problem in checked.problems:
            err.print(f"[red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_BAD_INPUT)
    stages = ", ".join(stage.name for stage in found.stages)
    out.print(f"{escape(spec)}: pipeline {found.name!r} ({found.digest[:12]}) is valid: {stages}",
              highlight=False, soft_wrap=True)  # fmt: skip


@pipeline.command()
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(spec: str, as_json: bool) -> None:
    """Show SPEC: its stages with their queues, tools, models, budgets and loops; the graph of
    what each stage reads, with its gate and fan-out; the pipeline's autonomy and run budget."""
    checked = _checked(spec)
    if checked.pipeline is None:
        for problem in checked.problems:
            err.print(f"[red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_BAD_INPUT)
    found = checked.pipeline
    if as_json:
        click.echo(json.dumps(pipeline_json(found), indent=2))
        return
    out.print(Group(stage_table(found, width=out.width), Text(""), graph(found), Text(""),
                    rules(found)))  # fmt: skip


@pipeline.command()
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(file_okay=False, path_type=Path), default=".",
              show_default=True, help="Where to make the package folder NAME.")  # fmt: skip
def new(name: str, parent: Path) -> None:
    """Scaffold a pipeline package NAME: a spec, a schemas module and a scenario the fake model
    plays, which run as they are."""
    written = scaffold(name, parent)
    folder = written[0].parent
    spec, scenario = folder / SPEC_FILE, folder / SCENARIO_FILE
    out.print(f"created {escape(str(folder))}: " + ", ".join(p.name for p in written))
    out.print(
        "Run it on the fake model from the folder that holds it (its schemas import from there),\n"
        "made a git repository (a run works on one: `--repo .`):\n"
        f"  baton pipeline check {spec}\n"
        f"  git init -q && git add -A && git -c user.name=me -c user.email=me@localhost "
        f'commit -qm "{name} pipeline"\n'
        f"  baton fake-gemini --scenario {scenario} --port 8765 &\n"
        "  export BATON_GEMINI_BASE_URL=http://127.0.0.1:8765 GOOGLE_API_KEY=fake\n"
        f"  baton worker --pipeline {spec} &\n"
        f'  echo "Checkout crashes on an empty cart" | baton enqueue - --repo . --pipeline {spec}',
        highlight=False,
        soft_wrap=True,
    )


def _checked(spec: str) -> Checked:
    settings = Settings()
    return check_pipeline(spec, queue=settings.queue, retry=settings.retry,
                          model=settings.model, prices=settings.prices)  # fmt: skip


def _model(stage: StageSpec) -> str:
    # Stages name their model once per-stage models land; until then, the worker's.
    return str(getattr(stage, "model", None) or DEFAULT_MODEL)


def _loop(stage: StageSpec) -> str:
    loop = getattr(stage, "loop", None)
    if loop is None:
        return ""
    return f"until {loop.until}, at most {loop.max_iterations}"


def _send_back(stage: StageSpec) -> str:
    rule = getattr(stage, "send_back", None)
    if rule is None:
        return ""
    where = "to a gate" if rule.then == "gate" else f"back to {rule.to}"
    return f"sends the run {where} unless {' and '.join(rule.unless)}"


def _stop(stage: StageSpec) -> str:
    rule = getattr(stage, "stop_when", None)
    return f"stops the run when {rule.field} = {rule.equals!r}" if rule is not None else ""


def stage_table(found: Pipeline, *, width: int | None = None) -> Any:
    """One line per stage: its queue, tools, model, budgets and loop."""
    columns = [
        Column("stage"),
        Column("queue"),
        Column("tools"),  # one a line, never cut: what an author declared is what they look for
        Column("model", drop=3),
        Column("calls", justify="right", drop=2),
        Column("req tok", justify="right", drop=4),
        Column("limit", justify="right", drop=1),
        Column("loop", shrink_to=10),
    ]
    rows = [
        [
            stage.name,
            stage.queue,
            "\n".join(stage.tools) or "—",
            _model(stage),
            str(stage.budget.max_model_calls),
            f"{stage.budget.max_request_tokens:,}",
            f"{stage.budget.time_limit_s}s",
            _loop(stage),
        ]
        for stage in found.stages
    ]
    title = f"pipeline {found.name} · {found.digest[:12]} · {len(found.stages)} stages"
    return fitted_table(columns, rows, width=width, title=title, title_justify="left")


def graph(found: Pipeline) -> Text:
    """The stages in order, each with the keys it reads and its rules, as text."""
    text = Text("graph:\n")
    order = " → ".join(_node(stage) for stage in found.stages)
    text.append(f"  issue → {order}\n")
    wide = max(len(stage.name) for stage in found.stages)
    for stage in found.stages:
        reads = " ".join(f"{{{key}}}" for key in stage.inputs) or "nothing"
        said = (fan_text(stage), _stop(stage), _loop(stage) and f"loops {_loop(stage)}",
                _send_back(stage), gate_text(stage))  # fmt: skip
        notes = "; ".join(note for note in said if note)
        text.append(
            f"  {stage.name:<{wide}}  ← {reads}" + (f"   ({notes})" if notes else "") + "\n"
        )
    text.rstrip()
    return text


def _node(stage: StageSpec) -> str:
    """A stage in the graph's line: `fix ⟲` loops, `review ↩ fix` sends the run back."""
    if getattr(stage, "loop", None):
        return f"{stage.name} ⟲"
    rule = getattr(stage, "send_back", None)
    return f"{stage.name} ↩ {rule.to}" if rule is not None and rule.then == "loop" else stage.name


def rules(found: Pipeline) -> Text:
    """The pipeline's run budget and autonomy rule, as text."""
    return Text("\n".join([budget_text(found), *autonomy_lines(found.autonomy)]))


def pipeline_json(found: Pipeline) -> dict[str, Any]:
    """The pipeline for scripts: its name and digest, each stage's routing, limits, gate and
    fan-out, and the pipeline's autonomy and run budget."""
    return {
        "name": found.name,
        "digest": found.digest,
        "description": found.description,
        "stages": [
            {
                "name": stage.name,
                "queue": stage.queue,
                "output_key": stage.output_key,
                "output_schema": stage.output_schema,
                "reads": stage.inputs,
                "tools": list(stage.tools),
                "model": _model(stage),
                "budget": stage.budget.model_dump(mode="json"),
                "loop": _loop(stage) or None,
                "send_back": _send_back(stage) or None,
                "stop": _stop(stage) or None,
                **stage_rules_json(stage),
            }
            for stage in found.stages
        ],
        **pipeline_rules_json(found),
    }

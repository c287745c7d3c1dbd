"""`baton demo`, `baton demo-review`, `baton fake-gemini` and `baton replay`, added to the `baton`
command by entry point: they need the fake Gemini server (the `fake` extra)."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from demo import SCENARIO
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.settings import Settings

if TYPE_CHECKING:  # the runner is imported when a demo runs, not when `baton` starts
    from demo.runner import DemoResult

EXIT_FAILED_RUN = 1


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for the run.")
@click.option("--keep", is_flag=True, help="Keep the demo's directory (remote, logs) afterwards.")
@click.option("--real-model", is_flag=True,
              help="Call Gemini itself (needs GOOGLE_API_KEY) instead of the bundled fake "
              "server, which plays the demo's scenario.")  # fmt: skip
@click.option("--pipeline", type=click.Choice(["fixer", "fixer-plus"]), default="fixer",
              show_default=True,
              help="fixer-plus: the fixer as a graph (a gate the demo approves, search "
              "subagents, three fixes at once).")  # fmt: skip
def demo(as_json: bool, timeout: float, keep: bool, real_model: bool, pipeline: str) -> None:
    """Run the fixer pipeline (or fixer-plus) on the bundled Sentry event and sample
    repository, with the bundled fake Gemini server as its model unless told --real-model."""
    from demo.runner import run_demo

    out, err = Console(), Console(stderr=True)
    result = run_demo(
        Settings(), timeout_s=timeout, console=err if as_json else out, keep=keep,
        real_model=real_model, pipeline=pipeline,
    )  # fmt: skip
    _finish(result, as_json, out)


def _finish(result: DemoResult, as_json: bool, out: Console) -> None:
    """Print a demo's result (its summary as JSON, or its table and what follows it) and exit
    with its run's outcome."""
    if as_json:
        click.echo(json.dumps(result.summary, indent=2))
    else:
        out.print(result.table)
        if result.extra:
            out.print(result.extra)
    sys.exit(0 if result.summary["status"] == RunStatus.DONE.value else EXIT_FAILED_RUN)


@click.command("demo-review")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for the run.")
def demo_review(as_json: bool, timeout: float) -> None:
    """Run the reviewer pipeline on the bundled pull request (a change to the sample repository
    with a subtle bug), with the fake Gemini server as its model and the fake GitHub receiving
    the review; shows the review posted."""
    from demo.review import run_review_demo

    out, err = Console(), Console(stderr=True)
    result = run_review_demo(Settings(), timeout_s=timeout, console=err if as_json else out)
    _finish(result, as_json, out)


@click.command("fake-gemini")
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False),
    help="Scenario JSON (default: the demo's).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, help="0 picks a free port.")
@click.option(
    "--record", type=click.Path(dir_okay=False), help="Append every request here (JSONL)."
)
def fake_gemini(scenario: str | None, host: str, port: int, record: str | None) -> None:
    """Serve the fake Gemini API (generateContent and streamGenerateContent)."""
    argv = [sys.executable, "-m", "testkit.gemini", "--scenario", scenario or str(SCENARIO)]
    argv += ["--host", host, "--port", str(port)]
    if record:
        argv += ["--record", record]
    os.execv(sys.executable, argv)


@click.command()
@click.argument("run_id")
@click.option("--stage", help="The stage to play again (default: the one that failed, else the "
              "last that ran).")  # fmt: skip
@click.option("--attempt", type=int, help="Which execution's replies (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def replay(run_id: str, stage: str | None, attempt: int | None, as_json: bool) -> None:
    """Play a stage of RUN_ID again offline: the model's recorded replies, served by the fake
    server in this process, with real tools in a fresh sandbox; nothing is published or written
    into the run. Exits 0 when the output is the recorded one, 1 when not."""
    from orchestrator.core.store import RunStore
    from testkit.replay import replay as play_again
    from workers.settings import WorkerSettings

    settings = WorkerSettings()
    store = RunStore.from_url(settings.redis_section())
    run = store.get(run_id)
    chosen = stage or _stage_to_replay(run)
    result = play_again(store, run_id, chosen, attempt=attempt, settings=settings)
    summary = {
        "run_id": run_id,
        "stage": result.stage,
        "attempt": result.attempt,
        "turns": [{"agent": t.agent, "reply": t.reply} for t in result.turns],
        "requests": result.requests,
        "same_output": result.same_output,
        "output": result.output,
        "recorded_output": result.recorded_output,
        "error": result.error,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        out = Console()
        table = Table(title=f"replay of {run_id} · {result.stage} · attempt {result.attempt}")
        for column in ("#", "agent", "recorded reply"):
            table.add_column(column)
        for number, turn in enumerate(result.turns, 1):
            table.add_row(str(number), turn.agent, escape(turn.reply))
        out.print(table)
        verdict = "the recorded output" if result.same_output else "not the recorded output"
        out.print(f"{result.requests} model requests; the replay gave {verdict}"
                  + (f": {escape(result.error)}" if result.error else ""))  # fmt: skip
    sys.exit(0 if result.same_output else EXIT_FAILED_RUN)


def _stage_to_replay(run: RunRecord) -> str:
    ran = [name for name, record in run.stages.items() if record.attempts]
    failed = [name for name in ran if run.stages[name].status == StageStatus.FAILED]
    if not ran:
        raise click.UsageError(f"no stage of run {run.id} has run yet")
    return (failed or ran)[-1]

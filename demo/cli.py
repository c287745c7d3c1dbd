"""`baton demo` and `baton fake-gemini`, added to the `baton` command by entry point."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console

from demo import SCENARIO
from orchestrator.models import RunStatus
from orchestrator.settings import Settings

EXIT_FAILED_RUN = 1


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for the run.")
@click.option("--keep", is_flag=True, help="Keep the demo's directory (remote, logs) afterwards.")
def demo(as_json: bool, timeout: float, keep: bool) -> None:
    """Run the fixer pipeline on the bundled Sentry event and sample repository."""
    from demo.runner import run_demo

    out, err = Console(), Console(stderr=True)
    result = run_demo(Settings(), timeout_s=timeout, console=err if as_json else out, keep=keep)
    if as_json:
        click.echo(json.dumps(result.summary, indent=2))
    else:
        out.print(result.table)
        if result.extra:
            out.print(result.extra)
    sys.exit(0 if result.summary["status"] == RunStatus.DONE.value else EXIT_FAILED_RUN)


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

"""The `baton` command.

Its commands are the orchestrator's own, plus those other packages add through the
`baton.commands` entry point group (pyproject.toml): `worker` from `workers`, `demo` and
`fake-gemini` from the demo and the test kit. The orchestrator never imports them: the command
line finds them by entry point, so a command whose package (or extra) is missing says so.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from importlib import metadata
from pathlib import Path

import click
import redis.exceptions
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from orchestrator.control import api, cli_gates, cli_inspect, cli_pipeline
from orchestrator.control.budget_view import budget_cell, budget_json, budget_line, spend_of_each
from orchestrator.control.messages import EXIT_AWAITING_APPROVAL, EXIT_BAD_INPUT, complaint
from orchestrator.control.report import (
    follow,
    recorded_outputs,
    run_json,
    run_view,
    runs_table,
)
from orchestrator.core.errors import BatonError, NotJsonError
from orchestrator.core.models import IssueSource, RunStatus
from orchestrator.core.settings import Settings

err = Console(stderr=True)
out = Console()

EXIT_FAILED_RUN = 1


COMMANDS_GROUP = "baton.commands"
"""Entry point group of the commands other packages add to `baton`."""


class BatonGroup(click.Group):
    """Turns Baton's own errors into a one-line message and a non-zero exit, not a traceback;
    adds the commands of the `baton.commands` entry points."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_plugins()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None or name not in _plugins():
            return command
        entry = _plugins()[name]
        try:
            loaded = entry.load()
        except ImportError as exc:
            return _unavailable(name, entry.value, exc)
        if not isinstance(loaded, click.Command):
            raise click.ClickException(f"entry point {entry.value} is not a click command")
        return loaded

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (BatonError, ValidationError, redis.exceptions.RedisError) as exc:
            said = complaint(exc)
            if said is None:
                raise
            # The message may quote the payload: never read it as markup, never wrap it.
            err.print(f"[red]error:[/] {escape(said.message)}", highlight=False, soft_wrap=True)
            sys.exit(said.exit_code)


@functools.cache
def _plugins() -> dict[str, metadata.EntryPoint]:
    return {entry.name: entry for entry in metadata.entry_points(group=COMMANDS_GROUP)}


def _unavailable(name: str, target: str, exc: ImportError) -> click.Command:
    """A stand-in for a command whose module cannot be imported: it says why and exits 2."""

    @click.command(name, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        err.print(
            f"[red]error:[/] `baton {name}` is not available: {escape(str(exc))} "
            f"(it comes from {escape(target)}; install Baton with its `fake` extra: "
            "pip install 'baton[fake]')",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_BAD_INPUT)

    command.help = f"(unavailable: {exc})"
    return command


@click.group(cls=BatonGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level to stderr.")
def main(verbose: bool) -> None:
    """Baton: LLM agent pipelines on a distributed task queue."""
    # A pipeline of one's own names its schemas by module: they import from the current folder
    # too, as they do in the workers (`python -m celery` starts there), but only after every
    # installed package, so that no file in the folder stands in for one.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@click.argument("payload", required=False)
@click.option("--text", help="The report as plain text (its first line is the title), instead of "
              "PAYLOAD.")  # fmt: skip
@click.option("--repo", required=True, help="Path or URL of the git repository to fix.")
@click.option(
    "--ref",
    help="The branch, tag or commit to work on (default: a pull request's head, else HEAD).",
)
@click.option(
    "--base",
    help="The branch, tag or commit a change is measured against (default: a pull request's "
    "base); a pipeline that reviews a change needs one.",
)
@click.option("--pipeline", default="fixer", show_default=True, help="Pipeline name or TOML file.")
@click.option(
    "--source", type=click.Choice([s.value for s in IssueSource]), help="Skip auto-detection."
)
@click.option("--force", is_flag=True, help="Start a new run even if this issue already has one.")
@click.option(
    "--env",
    "env_file",
    type=click.Path(dir_okay=False),
    help="An environment spec (TOML) to use instead of the repository's.",
)
@click.option(
    "--budget",
    help="Limits for this run in place of the pipeline's [run_budget] ones: "
    "tokens=N,calls=N,wall_s=S,iterations=N,handoffs=N,cost_usd=USD (any of them).",
)
def enqueue(
    payload: str | None,
    text: str | None,
    repo: str,
    ref: str | None,
    base: str | None,
    pipeline: str,
    source: str | None,
    force: bool,
    env_file: str | None,
    budget: str | None,
) -> None:
    """Enqueue a report against a repository; prints the run id.

    PAYLOAD is a JSON payload file (a Sentry event or issue, a GitHub issue or webhook): a file
    that is not JSON is refused. A report in plain text comes on stdin (PAYLOAD `-`) or in
    --text.
    """
    report = _report(payload, text, source)
    if text is not None:
        source = IssueSource.TEXT.value  # even text that starts with `{`
    try:
        run_id, created = api.submit(
            report, repo=repo, ref=ref, base=base, pipeline=pipeline, source=source, force=force,
            environment=env_file, budget=budget,
        )  # fmt: skip
    except NotJsonError as exc:
        raise NotJsonError(f"{exc}; a report in plain text goes on stdin (`baton enqueue - "
                           '...`) or in --text "..."') from exc  # fmt: skip
    if not created:
        err.print(f"this issue already has run {run_id}; use --force for a new one")
    click.echo(run_id)


def _report(payload: str | None, text: str | None, source: str | None) -> Path | bytes | str:
    """What `enqueue` was given to read: a payload file, stdin, or the text of --text."""
    if payload is None and text is None:
        raise click.UsageError("give a PAYLOAD file (or - for stdin), or --text")
    if payload is not None and text is not None:
        raise click.UsageError("give a PAYLOAD file (or - for stdin) or --text, not both")
    if payload is None:
        if source not in (None, IssueSource.TEXT.value):
            raise click.UsageError("--text is a plain-text report; --source does not apply")
        return text or ""
    if payload == "-":
        return sys.stdin.buffer.read()
    if source == IssueSource.TEXT.value:
        raise click.UsageError(
            "a PAYLOAD file is read as JSON; give plain text on stdin (-) or with --text"
        )
    return Path(payload)


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object, with what Baton measured and published.")  # fmt: skip
def status(run_id: str, as_json: bool) -> None:
    """Show a run: status and per-stage attempts, timings, tokens and waits, and what a running
    stage is doing now (as `watch` shows it); and if it waits on a queue no worker serves."""
    from orchestrator.control.fleet import unserved_note, unserved_queue

    with api.connect(Settings()) as conductor:
        store = conductor.store
        if as_json:
            run = store.get(run_id)
            pipeline, outputs = recorded_outputs(store, run)
            shown = run_json(run, outputs, pipeline)
            shown["budget"] = budget_json(run, spend_of_each(store, [run]).get(run.id))
            shown["unserved_queue"] = unserved_queue(store, run)
            click.echo(json.dumps(shown, indent=2))
            return
        run, table = run_view(store, run_id, width=out.width)
        out.print(table)
        if (line := budget_line(run, spend_of_each(store, [run]).get(run.id))) is not None:
            out.print(escape(line), highlight=False)
        for note in cli_gates.gate_notes(run):
            out.print(f"[yellow]{escape(note)}[/]", highlight=False)
        if (queue := unserved_queue(store, run)) is not None:
            out.print(f"[red]{escape(unserved_note(run, queue))}[/]", highlight=False)


@main.command()
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), help="Only these.")
@click.option("--pipeline", help="Only runs of this pipeline.")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def runs(status: str | None, pipeline: str | None, limit: int, as_json: bool) -> None:
    """List runs, the newest first."""
    found = api.list_runs(status=status, pipeline=pipeline, limit=limit)
    with api.connect(Settings()) as conductor:
        spent = spend_of_each(conductor.store, found)
    if as_json:
        shown = [{**run_json(run), "budget": budget_json(run, spent.get(run.id))} for run in found]
        click.echo(json.dumps(shown, indent=2))
    else:
        cells = {run.id: budget_cell(run, spent.get(run.id)) for run in found if run.budget}
        out.print(runs_table(found, width=out.width, budgets=cells))


@main.command()
@click.argument("run_id")
def cancel(run_id: str) -> None:
    """Cancel a run: its running stage stops at its next safe point, its sandbox goes."""
    if api.cancel(run_id):
        click.echo(f"run {run_id} cancelled")
    else:
        err.print(f"run {run_id} had already ended ({api.get_run(run_id).status.value})")
        sys.exit(EXIT_FAILED_RUN)


@main.command()
@click.argument("run_id")
@click.option("--from", "from_stage", help="Run again from this stage (default: the one that "
              "failed or was cancelled).")  # fmt: skip
@click.option(
    "--pipeline-version",
    type=click.Choice(["pinned", "latest"]),
    default="pinned",
    show_default=True,
    help="The version of the pipeline the run pinned at enqueue, "
    "or the latest: what --pipeline (default: the run's pipeline, by name) says now.",
)
@click.option("--pipeline", "pipeline", help="With --pipeline-version latest: the pipeline's "
              "file (or installed name) to read the latest version from.")  # fmt: skip
@click.option("--budget", help="Limits in place of the run's budget's, as enqueue's "
              "(a run its budget stopped needs a raised one).")  # fmt: skip
def resume(
    run_id: str, from_stage: str | None, pipeline_version: str, pipeline: str | None,
    budget: str | None,
) -> None:  # fmt: skip
    """Run a failed or cancelled run again, keeping every output recorded before that stage."""
    if pipeline is not None and pipeline_version != "latest":
        raise click.UsageError("--pipeline is only for --pipeline-version latest")
    if pipeline_version == "latest" and pipeline is None:
        pipeline = api.get_run(run_id).pipeline
    stage = api.resume(run_id, from_stage=from_stage, pipeline=pipeline, budget=budget)
    click.echo(f"run {run_id} resumed from {stage}")


@main.command()
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Show it once and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object and exit.")
def top(interval: float, once: bool, as_json: bool) -> None:
    """The fleet live: queue lengths, workers and the stages they run, runs by state."""
    from orchestrator.control.fleet import fleet_view, snapshot

    with api.connect(Settings()) as conductor:
        if as_json:
            click.echo(json.dumps(snapshot(conductor).as_json(), indent=2))
            return
        if once:
            out.print(fleet_view(snapshot(conductor), width=out.width))
            return
        view = fleet_view(snapshot(conductor), width=out.width)
        with Live(view, console=out, refresh_per_second=2) as live:
            while True:
                time.sleep(interval)
                live.update(fleet_view(snapshot(conductor), width=out.width))


@main.command()
def reconcile() -> None:
    """Put stages of stuck runs back on their queues now (workers also do it periodically); fail
    the runs whose pinned pipeline cannot be read."""
    from orchestrator.core.reconciler import Reconciler

    settings = Settings()
    with api.connect(settings) as conductor:
        sweep = Reconciler(conductor, settings.queue).sweep()
    for repair in sweep.repairs:
        click.echo(f"{repair.run_id}: {repair.stage} was stuck {repair.was}; sent again")
    for run_id, reason in sweep.failed.items():
        click.echo(f"{run_id}: failed: {reason}")
    for run_id, error in sweep.errors.items():
        err.print(f"{run_id}: could not be reconciled: {escape(error)}", highlight=False)
    if not (sweep.repairs or sweep.failed or sweep.errors):
        click.echo("no stuck runs")


@main.command()
@click.argument("run_id")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between refreshes.")
@click.option("--timeout", default=0.0, help="Give up after this many seconds (0: never).")
def watch(run_id: str, interval: float, timeout: float) -> None:
    """Follow a run live until it ends; exits non-zero if it failed or was cancelled, and 4
    when it parks awaiting approval, after saying how to approve or reject it."""
    run = follow(run_id, Settings(), interval_s=interval, timeout_s=timeout, console=out)
    if run.status == RunStatus.AWAITING_APPROVAL:
        err.print(f"run {escape(run_id)} awaits approval; the watch ends here", highlight=False)
        for note in cli_gates.gate_notes(run):
            err.print(f"[yellow]{escape(note)}[/]", highlight=False, soft_wrap=True)
        sys.exit(EXIT_AWAITING_APPROVAL)
    sys.exit(0 if run.status in (RunStatus.DONE, RunStatus.SKIPPED) else EXIT_FAILED_RUN)


@main.command()
@click.option("--port", default=5555, show_default=True, envvar="BATON_FLOWER_PORT")
@click.option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--no-auth", is_flag=True, help="Serve Flower without a login (trusted networks).")
def flower(port: int, address: str, no_auth: bool) -> None:
    """Start Flower on Baton's broker (BATON_REDIS_URL) to watch workers and stage tasks.

    Its login is BATON_FLOWER_USER / BATON_FLOWER_PASSWORD (HTTP basic auth); without them it
    refuses to start unless --no-auth is given. /metrics and /healthcheck never ask for the
    login: keep Flower's port on an internal network. Read-only: stop runs with `baton cancel`.
    """
    from orchestrator.control.flower import (
        FlowerCredentials,
        flower_argv,
        flower_config,
        flower_env,
    )

    Settings().redis_section()  # refused here, with a one-line message, rather than in Flower
    config = flower_config(FlowerCredentials(), port=port, address=address, auth=not no_auth)
    os.execve(sys.executable, flower_argv(config), flower_env(config, os.environ))


for _command in (cli_inspect.show, cli_inspect.diff, cli_inspect.artifacts,
                 cli_inspect.artifact, cli_inspect.log, cli_inspect.serve,
                 cli_pipeline.pipeline, cli_gates.approve, cli_gates.reject):  # fmt: skip
    main.add_command(_command)


if __name__ == "__main__":
    main()

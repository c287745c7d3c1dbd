"""`baton show`, `diff`, `artifacts`, `artifact`, `log` and `serve`: a run, read back.

Each reads the run store (`orchestrator.control.inspection`), so it works the same on a run that
ended long ago as on one still going; each has `--json` for scripts. Tables never cut a run id.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from orchestrator.control import inspection, plain
from orchestrator.control.api import connect
from orchestrator.control.branch_view import group_by_branch
from orchestrator.control.inspection import Entry
from orchestrator.control.tables import Column, counted, fitted_table
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore

out = Console()
err = Console(stderr=True)

FOLLOW_INTERVAL_S = 0.5


@contextmanager
def _store() -> Iterator[RunStore]:
    with connect(Settings()) as conductor:
        yield conductor.store


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@click.command()
@click.argument("run_id")
@click.option("--stage", help="Only this stage's output (`fix`, or `fix.1` for one iteration).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(run_id: str, stage: str | None, as_json: bool) -> None:
    """Show what RUN_ID's stages handed on: each stage's output, rendered."""
    with _store() as store:
        run = store.get(run_id)
        names = [stage] if stage else inspection.output_names(store, run)
        outputs = {name: inspection.output(store, run, name) for name in names}
    if as_json:
        summary = inspection.summarize(run).model_dump(mode="json")
        _echo_json({"run": summary, "outputs": outputs})
        return
    title = f"run {run.id} · {run.pipeline} · {run.status.value}"
    out.print(Text(title, style="bold"), soft_wrap=True)
    out.print(Text(plain.safe(f"issue: {run.issue.title}\nrepo:  {run.repo} @ {run.commit[:12]}")))
    if run.reason:
        out.print(Text(plain.safe(f"why:   {run.reason}"), style="red"))
    if not outputs:
        out.print("no stage has recorded an output yet")
    for name, value in outputs.items() if stage else distinct_outputs(outputs).items():
        out.print(Panel(render_output(value), title=name, title_align="left"))


def distinct_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """`outputs` without the iterations that repeat their stage's output: a looped stage keeps
    each iteration's output (`fix.1`, `fix.2`) beside its own (`fix`, the last one's), so a
    stage that ran once would show the same output twice."""
    return {
        name: value
        for name, value in outputs.items()
        if "." not in name or outputs.get(name.split(".", 1)[0]) != value
    }


def render_output(value: dict[str, Any]) -> RenderableType:
    """A stage output as a two-column table: field, value (a list of plain items on one line,
    comma-joined and wrapped; nested objects as indented fields)."""
    table = Table(show_header=False, box=None, pad_edge=False, expand=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, item in value.items():
        table.add_row(key, _render_value(item))
    return table


def _render_value(item: Any) -> RenderableType:
    if isinstance(item, dict):
        return render_output(item) if item else Text("{}", style="dim")
    if isinstance(item, list):
        if not item:
            return Text("none", style="dim")
        if all(not isinstance(i, (dict, list)) for i in item):
            return Text(plain.safe(", ".join(str(i) for i in item)))
        return Group(*(_render_value(i) for i in item))
    if item is None:
        return Text("—", style="dim")
    return Text(plain.safe(str(item)))


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the diff.")
def diff(run_id: str, as_json: bool) -> None:
    """Print RUN_ID's change (the published diff, else the fix's): highlighted in a terminal,
    plain when piped."""
    with _store() as store:
        run = store.get(run_id)
        ref = inspection.change(run)
        if ref is None:
            err.print(f"run {run_id} has made no change")
            sys.exit(1)
        _, chunks = inspection.read_artifact(store, ref)
        if as_json:
            text = b"".join(chunks).decode("utf-8", "replace")
            _echo_json({"run_id": run_id, "artifact": ref.name, "diff": text})
        elif out.is_terminal:
            text = b"".join(chunks).decode("utf-8", "replace")
            out.print(render_diff(text))
        else:
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()


def render_diff(text: str) -> Group:
    """A diff highlighted, one line of the terminal per line of the diff: a line wider than the
    terminal ends in `…` rather than going on to the next line, where it would read as a line
    of its own (piped, `baton diff` prints the diff as it is)."""
    text = plain.safe(text)  # a diff holds the repository's and the model's bytes
    lines = Syntax(text, "diff", background_color="default").highlight(text).split("\n")
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return Group(*lines)


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def artifacts(run_id: str, as_json: bool) -> None:
    """List RUN_ID's artifacts: test logs, diffs, build logs."""
    with _store() as store:
        found = inspection.artifacts(store.get(run_id))
    if as_json:
        _echo_json([a.model_dump() for a in found])
        return
    columns = [Column("name"), Column("stage", drop=1), Column("size", justify="right"),
               Column("type", drop=2)]  # fmt: skip
    rows = [[a.name, a.stage, _size(a.size_bytes), a.media_type] for a in found]
    title = f"run {run_id}: {counted(len(found), 'artifact')}"
    table = fitted_table(columns, rows, width=out.width, title=title, title_justify="left")
    out.print(table)


@click.command()
@click.argument("run_id")
@click.argument("name")
@click.option(
    "-o", "--output", "path", type=click.Path(dir_okay=False, path_type=Path),
    help="Write it to this file instead of standard output.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the artifact's record as JSON.")
def artifact(run_id: str, name: str, path: Path | None, as_json: bool) -> None:
    """Print (or save) one artifact of RUN_ID, by its name (`fix/tests-after.log`, or
    `tests-after.log` when one stage has it)."""
    with _store() as store:
        run = store.get(run_id)
        ref = inspection.find_artifact(run, name)
        if as_json and path is None:
            _echo_json(ref.model_dump())
            return
        _, chunks = inspection.read_artifact(store, ref)
        if path is None:
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return
        partial = path.with_name(path.name + ".part")
        with open(partial, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
        partial.replace(path)  # never half a file under the name asked for
    if as_json:
        _echo_json({**ref.model_dump(), "written_to": str(path)})
    else:
        err.print(f"wrote {ref.name} ({_size(ref.size_bytes)}) to {path}")


@click.command()
@click.argument("run_id")
@click.option("--stage", help="Only this stage's sessions.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new entries until the run ends.")
@click.option("--full", is_flag=True, help="Whole arguments, results and messages, wrapped to "
              "the terminal's width (by default each entry is one line, cut to fit).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--by-branch", is_flag=True, help="Group the entries by branch label "
              "(`fixer.fix.b1`, …), each group under a heading: the branches of a fan-out "
              "stage run at once, and their entries interleave.")  # fmt: skip
def log(
    run_id: str, stage: str | None, follow: bool, full: bool, as_json: bool, by_branch: bool
) -> None:
    """Print RUN_ID's audit stream as a transcript: the messages each stage's session was
    given, the model's replies and tool calls (arguments and results cut to the terminal's
    width, or whole with --full), retries and waits, each with its time and branch."""
    width = max(out.width, 60)
    if by_branch:
        if follow:
            raise click.UsageError("--by-branch groups a whole log; it does not --follow")
        with _store() as store:
            entries = inspection.whole_audit(store, run_id, stage=stage)
        _print_grouped(group_by_branch(entries), as_json, width, full=full)
        return
    with _store() as store:
        after: str | None = None
        while True:
            # The run's status before its entries: once it has ended, what is read next is all.
            ended = store.get(run_id).status.is_terminal
            after = _print_audit(store, run_id, stage, after, as_json, width, full=full)
            if not follow or ended:
                break
            time.sleep(FOLLOW_INTERVAL_S)


def _print_grouped(
    groups: dict[str, list[Entry]], as_json: bool, width: int, *, full: bool
) -> None:
    """Each branch label's entries under a heading naming it and counting them (JSON lines
    in the same order, without headings)."""
    for label, entries in groups.items():
        if not as_json:
            noun = "entry" if len(entries) == 1 else "entries"
            out.print(Text(f"── {plain.safe(label)} · {len(entries)} {noun}", style="bold"))
        for entry in entries:
            if as_json:
                click.echo(entry.model_dump_json())
            elif full:
                out.print(transcript_entry(entry))
            else:
                out.print(transcript_line(entry, width), soft_wrap=True)


def _print_audit(
    store: RunStore,
    run_id: str,
    stage: str | None,
    after: str | None,
    as_json: bool,
    width: int,
    *,
    full: bool,
) -> str | None:
    """Print the entries after `after`, page by page, to the last; returns the last one's id."""
    while True:
        page = inspection.read_audit(store, run_id, stage=stage, after=after, limit=500)
        for entry in page.entries:
            if as_json:
                click.echo(entry.model_dump_json())
            elif full:
                out.print(transcript_entry(entry))
            else:
                out.print(transcript_line(entry, width), soft_wrap=True)
        if page.entries:
            after = page.entries[-1].id
        if not page.next_after:
            return after


_KIND_STYLE = {
    "user_message": "blue",
    "model_reply": "green",
    "tool_call": "cyan",
    "tool_result": "dim",
    "compaction": "magenta",
    "error": "red",
    "stage_failed": "red",
    "stage_waiting": "yellow",
    "run_cancelled": "red",
}


_INDENT = "  "
"""A child's entries are indented this much per level under its stage's (`Entry.depth`)."""


def transcript_line(entry: Entry, width: int) -> Text:
    """One entry as a line a person reads: `13:09:47.531 fixer.search  call search_code(…)`,
    every part cut to fit `width`."""
    clock = datetime.fromtimestamp(entry.ts).strftime("%H:%M:%S.%f")[:-3]
    head = f"{clock} {_INDENT * entry.depth}{entry.branch or '-':<16} "
    room = max(20, width - len(head) - 1)
    line = Text(head, style="dim")
    body = plain.safe(_describe(entry))
    line.append(_cut(body, room), style=_KIND_STYLE.get(entry.kind, ""))
    return line


def transcript_entry(entry: Entry) -> Table:
    """One entry whole, for `log --full`: its time and branch, and beside them every part of
    it, each on lines of its own, wrapped to the width it is printed at and never cut."""
    clock = datetime.fromtimestamp(entry.ts).strftime("%H:%M:%S.%f")[:-3]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column(overflow="fold")
    body = Text(_describe_whole(entry), style=_KIND_STYLE.get(entry.kind, ""))
    grid.add_row(f"{clock} {_INDENT * entry.depth}{entry.branch or '-':<16}", body)
    return grid


def _describe_whole(entry: Entry) -> str:
    """The entry in words, every part on lines of its own: a call's arguments and a result's
    fields one per line under it, a text whole (`orchestrator.control.plain`)."""
    if not entry.parts:
        return plain.safe(_describe(entry))
    said = []
    for part in entry.parts:
        if part.kind in ("call", "result"):
            value = part.args if part.kind == "call" else part.result
            said += [f"{part.kind} {part.tool}", *plain.lines(value or {}, depth=1)]
        else:
            alone = entry.model_copy(update={"parts": [part], "usage": None})
            said.append(plain.safe(_describe(alone)))
    if entry.usage:
        said[0] = f"[{entry.usage.prompt_tokens:,} tok in] " + said[0]
    return "\n".join(said)


def _describe(entry: Entry) -> str:
    """The entry in words on one line: its parts joined by ` | `, or its kind and data."""
    if entry.parts:
        said = []
        for part in entry.parts:
            if part.kind == "call":
                args = ", ".join(f"{k}={json.dumps(v)}" for k, v in (part.args or {}).items())
                said.append(f"call {part.tool}({args})")
            elif part.kind == "result":
                said.append(f"result {part.tool}: {json.dumps(part.result, default=str)}")
            elif part.kind == "thought":
                said.append(f"thought: {part.text}")
            else:
                who = "user" if entry.kind == "user_message" else "model"
                said.append(f"{who}: {part.text}")
        text = " | ".join(said)
        if entry.usage:
            text = f"[{entry.usage.prompt_tokens:,} tok in] " + text
        return text
    if entry.error and not entry.data:
        return f"{entry.kind}: {entry.error}"
    details = ", ".join(f"{k}={v}" for k, v in entry.data.items())
    return f"{entry.kind} {details}".rstrip()


def _cut(text: str, room: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= room else flat[: room - 1] + "…"


def _size(size: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@click.command()
@click.option("--port", default=8080, show_default=True, envvar="BATON_SERVE_PORT")
@click.option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--no-auth", is_flag=True, help="Serve without logins or tokens (trusted networks): "
              "anyone reaching the port may cancel and resume runs.")  # fmt: skip
def serve(port: int, address: str, no_auth: bool) -> None:
    """Serve the REST API (/api/v1, OpenAPI at /api/openapi.json) and the web UI.

    Logins: BATON_SERVE_USER / BATON_SERVE_PASSWORD (control scope) and BATON_SERVE_LOGINS
    ('{"viewer": "read:<password>"}'); tokens for scripts: BATON_SERVE_TOKENS
    ('{"ci": "read:<token>"}'). Without any it refuses to start unless --no-auth is given.
    /api/v1/health answers without a login. Behind a proxy: BATON_SERVE_FORWARDED_ALLOW_IPS
    (docs/serve.md).
    """
    import uvicorn

    from orchestrator.control.server.app import create_app
    from orchestrator.control.server.auth import Authenticator, ServeSettings

    serve_settings = ServeSettings()
    serve_settings.check_secrets()
    if not no_auth and not Authenticator(serve_settings).configured:
        raise ConfigError(
            "baton serve needs a login or a token (BATON_SERVE_USER and BATON_SERVE_PASSWORD, "
            "BATON_SERVE_LOGINS or BATON_SERVE_TOKENS), or --no-auth"
        )
    with connect(Settings()) as conductor:
        app = create_app(conductor, serve_settings, auth_required=not no_auth)
        err.print(f"serving runs on http://{escape(address)}:{port}/ (API at /api/v1)")
        # The app believes the proxies of BATON_SERVE_FORWARDED_ALLOW_IPS and nobody else's
        # X-Forwarded-* headers; uvicorn's own default would believe any local process's.
        uvicorn.run(app, host=address, port=port, log_level="warning", access_log=False,
                    proxy_headers=False)  # fmt: skip

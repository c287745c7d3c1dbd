"""What `baton demo-review` shows of the review the fake GitHub received: its summary, then a
table of every comment the review stage wrote, with where GitHub holds it (on its line of the
diff, or in the review's body because the diff does not show that line)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from orchestrator.pipelines.reviewer.diff import MOVED_HEADING

SEVERITY_STYLES = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "dim"}
ON_LINE, IN_BODY, NOT_POSTED = "on its line", "in the body", "not posted"


def where_posted(comment: Mapping[str, Any], review: Mapping[str, Any]) -> str:
    """Where GitHub holds `comment` (the review stage's `{path, line, …}`) in `review` (as GitHub
    returned it, with its comments): on its line, in the body (the line is not in the diff), or
    not at all."""
    path, line = str(comment["path"]).removeprefix("./"), comment["line"]
    if any((c["path"], c["line"]) == (path, line) for c in review["comments"]):
        return ON_LINE
    if f"`{path}:{line}`" in review["body"]:
        return IN_BODY
    return NOT_POSTED


def comments_table(written: Sequence[Mapping[str, Any]], review: Mapping[str, Any]) -> Table:
    """One row a comment: file and line, severity, where GitHub holds it, and its text."""
    table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False)
    table.add_column("file:line", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("posted", no_wrap=True)
    table.add_column("comment", ratio=1)
    places = [where_posted(comment, review) for comment in written]
    if IN_BODY in places:
        table.caption = "in the body: the diff does not show that line, so the comment went into "
        table.caption += "the review's text, with the reason"
    for comment, place in zip(written, places, strict=True):
        severity = str(comment["severity"])
        table.add_row(
            f"{comment['path']}:{comment['line']}",
            Text(severity, style=SEVERITY_STYLES.get(severity, "")),
            place,
            Text(str(comment["text"])),
        )
    return table


def review_panel(
    review: Mapping[str, Any], written: Sequence[Mapping[str, Any]], pull: Mapping[str, Any]
) -> RenderableType:
    """The posted review: state, pull request, commit and URL, the summary (the body without the
    comments moved into it and without the run's marker), then the comments' table."""
    summary = str(review["body"]).split(f"**{MOVED_HEADING}**")[0].split("<!--")[0].strip()
    repository = pull["base"]["repo"]["full_name"]
    heading = Text.assemble(
        (f"{review['state']} on {repository}#{pull['number']}", "bold"),
        f" · commit {str(review['commit_id'])[:12]} · {review['html_url']}\n\n",
        summary + "\n",
    )
    return Group(Rule("review posted", align="left"), heading, comments_table(written, review))

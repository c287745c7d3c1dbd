"""Plain text as an `Issue`: the first non-blank line is the title, the rest is the body."""

from __future__ import annotations

from orchestrator.control.intake.fields import clean, trim_lines
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import Issue, IssueSource


def parse_text(text: str) -> Issue:
    """An `Issue` from a free-form error report; blank text is refused."""
    lines = clean(text).splitlines()
    for index, line in enumerate(lines):
        if line.strip():
            body = trim_lines("\n".join(lines[index + 1 :]))
            return Issue(source=IssueSource.TEXT, title=line.strip(), body=body)
    raise IntakeError(
        "the report is empty; send a Sentry event, a GitHub issue, or text whose first line "
        "says what went wrong"
    )

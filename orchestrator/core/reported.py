"""What a report says failed, as facts a test's output can be checked against.

A Sentry event carries them structured: the exception's type and its stack, with the frames of
the application marked. A GitHub issue or a text report may quote a Python traceback, read here
the same way (the last one, when exceptions were chained). A report with neither says nothing a
test's output can be held to.

The reproduction check (`workers.proof.check_reproduction`) holds the reproducing test's own
output to these facts: the exception it raises must be the report's type, and the function
that raised it in the report must be on its failing stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from orchestrator.core.models import Issue, IssueSource

MAX_TRACEBACK_CHARS = 200_000
"""How much of a report's text is searched for a traceback (the end of it: the newest)."""
MAX_TEXT_CHARS = 400_000
"""How much of a report's text (title, message, body) is read for the words it holds."""
SOURCES = {
    IssueSource.SENTRY_EVENT: "the Sentry event",
    IssueSource.SENTRY_ISSUE: "the Sentry issue's latest event",
    IssueSource.GITHUB: "the issue",
    IssueSource.TEXT: "the report",
    IssueSource.PULL_REQUEST: "the pull request",
}
"""How a sentence names a report's structured facts, by where it came from."""
_TRACEBACK = re.compile(r"^([ \t>]*)Traceback \(most recent call last\):[ \t]*$", re.MULTILINE)
_FRAME = re.compile(r'^[ \t]+File "([^"\n]+)", line \d+, in ([\w<>.]+)[ \t]*$')
_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::[ \t]|:?[ \t]*$)")
_WORD = re.compile(r"[A-Za-z_]\w*")
_NOT_THE_APPLICATION = re.compile(r"site-packages|dist-packages|/lib/python\d|^<frozen |^<")


@dataclass(frozen=True)
class ReportedFailure:
    """The exception a report shows and where it was raised."""

    error_type: str
    """Its type's own name, without a module (`ZeroDivisionError`, `CartError`)."""
    function: str | None
    """The function of the application that raised it (the newest frame in the application),
    if the report shows one."""
    source: str
    """Where the facts come from, as a sentence says it: "the Sentry event"."""
    words: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The words of the report's own text (title, error message, body), as a type's name would
    be one: an error a fix lets out instead of the report's must be one of them (the report
    asks for it) or a kind of the report's (`workers.proof`). Not a fact of the failure: two
    reports of one failure are equal however they are worded."""

    def names(self, error: str) -> bool:
        """Whether the report's text names the type `error` (its own name, as a word)."""
        return type_name(error) in self.words

    def describe(self) -> str:
        where = f" in {self.function}" if self.function else ""
        return f"{self.error_type} raised{where}, as {self.source} shows"


def reported_failure(issue: Issue) -> ReportedFailure | None:
    """The failure `issue` shows in structured form, or None when it shows none."""
    if issue.source is IssueSource.PULL_REQUEST:
        return None
    if issue.error_type:
        in_app = [f.function for f in issue.frames if f.in_app and f.function]
        named = [f.function for f in issue.frames if f.function]
        chosen = in_app or named
        function = chosen[-1] if chosen else None
        found: ReportedFailure | None = ReportedFailure(
            type_name(issue.error_type), function, SOURCES[issue.source]
        )
    else:
        found = traceback_in(issue.body or "")
    if found is None:
        return None
    text = "\n".join((issue.title, issue.error_message or "", issue.body or ""))
    return replace(found, words=frozenset(_WORD.findall(text[:MAX_TEXT_CHARS])))


def traceback_in(text: str) -> ReportedFailure | None:
    """The last Python traceback quoted in `text` (`Traceback (most recent call last):` at a
    line's start, after any indentation or `>` quoting, which its other lines share; its
    `File "…", line N, in f` frames; then the exception's own line), or None."""
    text = text[-MAX_TRACEBACK_CHARS:]
    starts = list(_TRACEBACK.finditer(text))
    if not starts:
        return None
    header = starts[-1]
    prefix = header.group(1)
    frames: list[tuple[str, str]] = []
    for line in text[header.end() :].splitlines()[1:]:
        line = line.removeprefix(prefix)
        frame = _FRAME.match(line)
        if frame:
            frames.append((frame.group(1), frame.group(2)))
        elif line[:1] not in (" ", "\t", ""):  # not a frame's source line: the exception's
            raised = _RAISED.match(line)
            if raised is None or not frames:
                return None
            in_app = [name for path, name in frames if not _NOT_THE_APPLICATION.search(path)]
            function = (in_app or [name for _, name in frames])[-1]
            return ReportedFailure(
                type_name(raised.group(1)), function, "the traceback in the report"
            )
    return None


def type_name(qualified: str) -> str:
    """An exception type's own name: `shopcart.errors.CartError` is `CartError`."""
    return qualified.rsplit(".", 1)[-1]

"""Where a review comment may go: the lines of a pull request's diff, as GitHub reads them.

GitHub takes a review comment on a line of the head (`side: RIGHT`) only when the pull request's
diff shows that line: an added line, or a context line of a hunk. Any other comment makes it
refuse the whole review (422). So the comments are placed first: each on its line when the diff
shows it, else moved into the review's body with the reason, and none is lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.pipelines.reviewer.schemas import ReviewComment

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
MOVED_HEADING = "Comments on lines outside the diff"


@dataclass(frozen=True)
class Moved:
    """A comment that cannot sit on its line, and why."""

    comment: ReviewComment
    reason: str


def commentable_lines(patch: str) -> set[int]:
    """The lines of the head's version of a file that a comment may be on: every added and
    every context line of the patch's hunks (GitHub's `patch` of a file, or the part of a
    `git diff` from the file's first `@@` on)."""
    lines: set[int] = set()
    number: int | None = None
    for text in patch.splitlines():
        hunk = _HUNK.match(text)
        if hunk:
            number = int(hunk.group(1))
            continue
        if number is None or text.startswith(("-", "\\")):
            continue  # before the first hunk; a removed line; "\ No newline at end of file"
        if text.startswith(("+", " ")) or text == "":
            lines.add(number)
            number += 1
    return lines


def place_comments(
    comments: Iterable[ReviewComment], patches: Mapping[str, str | None]
) -> tuple[list[ReviewComment], list[Moved]]:
    """The comments that may sit on their line, and those moved with the reason. `patches`:
    each changed file's patch by path; None for a file whose diff GitHub does not show (a
    binary file, or one too large)."""
    placed: list[ReviewComment] = []
    moved: list[Moved] = []
    shown = {path: commentable_lines(patch) for path, patch in patches.items() if patch}
    for comment in comments:
        path = comment.path.removeprefix("./")
        if path not in patches:
            moved.append(Moved(comment, f"{path} is not changed by the pull request"))
        elif path not in shown:
            moved.append(Moved(comment, f"GitHub shows no diff of {path} (binary or too large)"))
        elif comment.line not in shown[path]:
            ranges = _ranges(sorted(shown[path]))
            moved.append(Moved(comment, f"line {comment.line} of {path} is not in the diff, "
                                        f"which shows lines {ranges} of it"))  # fmt: skip
        else:
            placed.append(comment.model_copy(update={"path": path}))
    return placed, moved


def comment_text(comment: ReviewComment) -> str:
    """A comment as posted: its severity first."""
    return f"**{comment.severity}**: {comment.text}"


def review_body(body: str, moved: Sequence[Moved], marker: str) -> str:
    """The review's text: the summary, the comments moved into it with their reasons, and a
    `marker` (an HTML comment GitHub does not show) that finds the review again."""
    parts = [body.strip()]
    if moved:
        items = [
            f"- `{m.comment.path}:{m.comment.line}` {comment_text(m.comment)} _(moved here: "
            f"{m.reason})_"
            for m in moved
        ]
        parts.append(f"**{MOVED_HEADING}**\n\n" + "\n".join(items))
    parts.append(marker)
    return "\n\n".join(parts)


def _ranges(numbers: Sequence[int]) -> str:
    """`3–7, 12, 40–41`: sorted line numbers as runs."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)

"""How `baton log`, `show` and `diff` lay out what they read: `log --full` cuts nothing, `show`
says each output once with a list's items on one line, `diff` never splits a line of the diff."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console, RenderableType

from orchestrator.control.cli_inspect import (
    distinct_outputs,
    render_diff,
    render_output,
    transcript_entry,
    transcript_line,
)
from orchestrator.control.inspection import Entry, Part
from orchestrator.control.tables import Column, fitted_table

LONG_PATCH = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(40))
"""A tool argument far wider than any terminal: 40 lines, about 2,200 characters."""


def rendered(renderable: RenderableType, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def a_call(**args: object) -> Entry:
    return Entry(
        id="1-0", ts=0.0, branch="fixer.fix", stage="fix", attempt=1, kind="tool_call",
        parts=[Part(kind="call", tool="apply_patch", args=args),
               Part(kind="result", tool="apply_patch", result={"applied": True, "log": "x" * 300})],
    )  # fmt: skip


def _ink(text: str) -> str:
    """`text` without its blank space: what wrapping at spaces cannot change."""
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("width", [60, 80, 132])
def test_log_full_prints_every_character_of_a_call_wrapped_within_the_width(width: int) -> None:
    entry = a_call(patch=LONG_PATCH, path="cart.py")

    lines = rendered(transcript_entry(entry), width).splitlines()
    head = lines[0].index("call apply_patch")

    assert all(len(line.rstrip()) <= width for line in lines)
    assert all(line[:head].strip() == "" for line in lines[1:])  # beside the time and branch
    body = _ink("".join(line[head:] for line in lines))
    assert _ink(LONG_PATCH) in body  # whole: not one character cut, no escapes
    assert _ink(f"log: {'x' * 300}") in body and "…" not in body
    assert lines[0].split()[1] == "fixer.fix"


def test_log_full_puts_each_part_and_each_field_on_lines_of_its_own() -> None:
    entry = a_call(path="cart.py", patch="-old\n+new", hunks=[{"line": 3}, 7])

    lines = rendered(transcript_entry(entry), 400).splitlines()
    head = lines[0].index("call")

    assert [line[head:].rstrip() for line in lines] == [
        "call apply_patch",
        "  path: cart.py",
        "  patch:",
        "    -old",
        "    +new",
        "  hunks:",
        "    -",
        "      line: 3",
        "    - 7",
        "result apply_patch",
        "  applied: true",
        f"  log: {'x' * 300}",
    ]


def test_log_full_shows_a_hostile_tool_result_s_control_characters_escaped() -> None:
    hostile = "ok\x1b]0;owned\x07\x1b[2J\rdone\u009b31m"
    entry = Entry(
        id="1-0", ts=0.0, branch="fixer.search", stage="search", attempt=1, kind="tool_call",
        parts=[Part(kind="result", tool="read_file", result={"content": hostile}),
               Part(kind="text", text=f"model says {hostile}")],
    )  # fmt: skip

    shown = rendered(transcript_entry(entry), 200)

    assert _no_control(shown)
    assert "ok\\x1b]0;owned\\x07\\x1b[2J\\x0ddone\\x9b31m" in shown  # both, escaped
    assert shown.count("\\x1b]0;owned") == 2


def test_the_default_log_line_stays_one_cut_line() -> None:
    line = transcript_line(a_call(patch=LONG_PATCH), 80)

    assert len(line.plain) <= 80 and line.plain.endswith("…") and "\n" not in line.plain


def test_show_says_a_stage_that_ran_once_once() -> None:
    fix = {"summary": "guard the empty cart", "files": ["cart.py"]}
    outputs = {"triage": {"a": 1}, "fix": fix, "fix.1": dict(fix)}

    assert list(distinct_outputs(outputs)) == ["triage", "fix"]


def test_show_keeps_the_iterations_that_differ_from_the_last() -> None:
    first, second = {"summary": "try 1"}, {"summary": "try 2"}
    outputs = {"fix": second, "fix.1": first, "fix.2": second}

    assert distinct_outputs(outputs) == {"fix": second, "fix.1": first}


def test_a_list_of_plain_items_is_one_comma_joined_line_wrapped_within_the_width() -> None:
    files = [f"src/shop/module_{n}.py" for n in range(12)]
    output = {"summary": "s", "files_to_change": files, "steps": []}

    text = rendered(render_output(output), 60)
    lines = text.splitlines()
    value = " ".join(line[len("files_to_change ") :].strip() for line in lines[1:-1])

    assert lines[0].split() == ["summary", "s"]
    assert value == ", ".join(files)
    assert 1 < len(lines) - 2 < len(files)  # wrapped, and not one item a line
    assert "•" not in text and all(len(line.rstrip()) <= 60 for line in lines)
    assert lines[-1].split() == ["steps", "none"]


DIFF = (
    "--- a/cart.py\n+++ b/cart.py\n@@ -1,2 +1,2 @@\n def total(prices):\n"
    f"-    return sum(prices) / len(prices)  # {'a' * 120}\n"
    "+    return sum(prices) / max(1, len(prices))\n"
)


def test_diff_never_breaks_a_line_of_the_diff_and_marks_a_cut_one() -> None:
    lines = rendered(render_diff(DIFF), 60).rstrip("\n").splitlines()

    assert len(lines) == len(DIFF.splitlines())  # one line of the terminal per line of the diff
    assert [line.rstrip() for line in lines if len(line.rstrip()) < 60] == [
        line for line in DIFF.splitlines() if len(line) < 60
    ]
    cut = next(line for line in lines if line.startswith("-    return"))
    assert len(cut.rstrip()) == 60 and cut.rstrip().endswith("…")
    assert re.fullmatch(r"-    return sum\(prices\) / len\(prices\)  # a+…", cut.rstrip())


HOSTILE = "ok\x1b]0;owned\x07\x1b[2J\rdone\x9b31m"
"""A repository's or a model's bytes that would retitle, clear and recolour a terminal."""


def _no_control(shown: str) -> bool:
    return not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in shown)


@pytest.mark.parametrize(
    "renderable",
    [
        pytest.param(lambda: transcript_line(Entry(
            id="1-0", ts=0.0, branch="fixer.triage", stage="triage", attempt=1,
            kind="model_reply", parts=[Part(kind="text", text=HOSTILE)]), 200), id="log"),
        pytest.param(lambda: render_output({"summary": HOSTILE, "files": [HOSTILE]}), id="show"),
        pytest.param(lambda: render_diff(f"+{HOSTILE}\n"), id="diff"),
        pytest.param(lambda: fitted_table([Column("issue")], [[HOSTILE]], width=80), id="table"),
    ],
)  # fmt: skip
def test_no_view_passes_a_control_character_to_the_terminal(renderable: Any) -> None:
    shown = rendered(renderable(), 200)

    assert _no_control(shown)
    assert "\\x1b]0;owned" in shown  # still there for the reader, escaped

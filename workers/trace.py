"""Which lines of the repository a Python test run executes, and whether a change touches any.

The proof runs the reproducing tests on the unchanged code with a line tracer: a
`sitecustomize` Baton puts in the workspace (`.baton-trace/`) and on `PYTHONPATH`, which
records, in every Python process the command starts, the lines run in files under the
workspace, and writes them out as the process ends. A fix none of whose changed lines (in files
that are not tests) is among them changes nothing the failing test runs, so it cannot be what
makes it pass (`workers.proof`).

What this cannot see is not refused: a run that wrote no record (not Python, `python -I`, a
process killed before its end), a record too large to read, a changed file of another
language. The record is written by code in the same processes as the tests, so a test that
set out to forge it could; it is a check on where a fix is, not a seal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

TRACE_DIR = ".baton-trace"
RECORD = f"{TRACE_DIR}/lines.txt"
MAX_RECORD_CHARS = 1_900_000
"""A record this long may have been cut when read: nothing is judged from it."""
TRACER = '''"""Baton's line tracer (workers/trace.py): lines run in files under BATON_TRACE_ROOT."""
import atexit, os, sys, threading

_root = os.environ.get("BATON_TRACE_ROOT", "")
_out = os.environ.get("BATON_TRACE_OUT", "")
_seen = {}


def _local(frame, event, arg):
    if event == "line":
        _seen[frame.f_code.co_filename].add(frame.f_lineno)
    return _local


def _call(frame, event, arg):
    name = frame.f_code.co_filename
    full = name if name.startswith("/") else os.path.abspath(name)
    if not full.startswith(_root) or "/.baton-trace/" in full:
        return None
    _seen.setdefault(name, set()).add(frame.f_lineno)
    return _local


def _write():
    sys.settrace(None)
    lines = "".join(f"{n}\\t{','.join(map(str, sorted(s)))}\\n" for n, s in _seen.items())
    try:
        with open(_out, "a") as out:
            out.write(lines)
    except OSError:
        pass


if _root and _out:
    sys.settrace(_call)
    threading.settrace(_call)
    atexit.register(_write)
'''
"""The `sitecustomize.py` that records the lines (Python 3.8 and later)."""
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def traced(argv: Sequence[str], root: str) -> tuple[list[str], dict[str, str]]:
    """`argv` run with the tracer: the command (the tracer's folder put before any
    `PYTHONPATH` the environment has) and the variables it reads."""
    folder = f"{root.rstrip('/')}/{TRACE_DIR}"
    wrapped = ["sh", "-c", 'PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}" exec "$@"', folder, *argv]
    return wrapped, {"BATON_TRACE_ROOT": root.rstrip("/") + "/",
                     "BATON_TRACE_OUT": f"{root.rstrip('/')}/{RECORD}"}  # fmt: skip


def executed(record: str, root: str) -> dict[str, set[int]] | None:
    """The lines each file under `root` ran, by path relative to it, from the tracer's
    `record`; None when there is none to read, or it may have been cut."""
    if not record.strip() or len(record) >= MAX_RECORD_CHARS:
        return None
    prefix = root.rstrip("/") + "/"
    lines: dict[str, set[int]] = {}
    for row in record.splitlines():
        name, _, numbers = row.partition("\t")
        if not name.startswith(prefix) or not numbers:
            continue
        ran = lines.setdefault(name[len(prefix) :], set())
        ran.update(int(n) for n in numbers.split(",") if n.isdigit() and int(n) > 0)
    return lines


def touched_lines(section: str) -> set[int]:
    """The lines of the unchanged file one file's diff `section` touches: those it changes or
    removes, and for an insertion the lines either side of it."""
    touched: set[int] = set()
    old, replacing = 0, False
    for line in section.splitlines():
        hunk = _HUNK.match(line)
        if hunk:
            old, replacing = int(hunk.group(1)), False
            if hunk.group(2) == "0" and old:  # an insertion after line `old`
                touched.update({old, old + 1})
                old += 1
            continue  # (`-0,0`: a new file, whose lines the unchanged code never had)
        if not old or line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            touched.add(old)
            old, replacing = old + 1, True
        elif line.startswith("+") and not replacing:  # inserted between old - 1 and old
            touched.update({old - 1, old})
        elif line.startswith(" "):
            old, replacing = old + 1, False
    return {n for n in touched if n > 0}


def off_path(sections: Mapping[str, str], ran: Mapping[str, set[int]]) -> bool:
    """Whether the change (`sections`: each changed code file's diff) certainly touches no
    line the run executed (`ran`): False as soon as one does, and whenever that cannot be told
    (a file that is not Python, which the tracer does not see, or a new file, which the
    unchanged code could not run)."""
    touched = {path: touched_lines(section) for path, section in sections.items()}
    if not touched or any(not path.endswith(".py") or not lines for path, lines in touched.items()):
        return False
    return not any(lines & ran.get(path, set()) for path, lines in touched.items())

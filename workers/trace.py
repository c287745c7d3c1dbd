"""Which lines of the repository a Python test run executes, and whether a change touches any.

The proof runs the reproducing tests on the unchanged code with a line tracer: a
`sitecustomize` Baton puts in the workspace (`.baton-trace/`) and on `PYTHONPATH`, which
records, in every Python process the command starts, the lines run in files under the
workspace, and writes them out as the process ends. A coverage tool in the test command
(pytest-cov's `--cov`) takes the line tracer's place; then the functions called, which a
profile hook records beside it, stand in: every line of each. A fix none of whose changed
lines (in files that are not tests) is among them changes nothing the failing test runs, so it
cannot be what makes it pass (`workers.proof`).

What this cannot see is not refused: a run that wrote no record (not Python, `python -I`, a
process killed before its end), a record too large to read, a changed file of another
language. The record is written by code in the same processes as the tests, so a test that
set out to forge it could; it is a check on where a fix is, not a seal.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.reported import type_name

TRACE_DIR = ".baton-trace"
RECORD = f"{TRACE_DIR}/lines.txt"
MAX_RECORD_CHARS = 1_900_000
"""A record this long may have been cut when read: nothing is judged from it."""
TRACER = '''"""Baton's line tracer (workers/trace.py): what runs in files under BATON_TRACE_ROOT."""
import atexit, os, sys, threading

_root = os.environ.get("BATON_TRACE_ROOT", "")
_out = os.environ.get("BATON_TRACE_OUT", "")
_lines = {}
_called = set()
_pending = {}  # frame: the type of the exception raised in it, until it is caught or let out
_raised = set()  # (types, file, function, caller's file, its line): exceptions let out


def _ours(name):
    if name.startswith("<"):  # `<frozen importlib._bootstrap>`, `<string>`: no file
        return False
    full = name if name.startswith("/") else os.path.abspath(name)
    return full.startswith(_root) and "/.baton-trace/" not in full


def _local(frame, event, arg):
    if event == "line":
        _lines[frame.f_code.co_filename].add(frame.f_lineno)
        if _pending:  # an exception raised here was caught here
            _pending.pop(frame, None)
    elif event == "exception":
        _pending[frame] = arg[0]
    elif event == "return" and _pending:
        kind = _pending.pop(frame, None)
        code = frame.f_code
        if kind is not None and code.co_name != "<module>" and len(_raised) < 1000:
            back = frame.f_back
            caller, at = (back.f_code.co_filename, back.f_lineno) if back else ("", 0)
            name = getattr(code, "co_qualname", code.co_name)
            kinds = ",".join(k.__qualname__ for k in kind.__mro__[:-1])  # itself first
            _raised.add((kinds, code.co_filename, name, caller, at))
    return _local


def _call(frame, event, arg):
    if not _ours(frame.f_code.co_filename):
        return None
    _lines.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
    return _local


def _profile(frame, event, arg):
    if event == "call" and _ours(frame.f_code.co_filename):
        _called.add(frame.f_code)


def _write():
    sys.settrace(None)
    sys.setprofile(None)
    lines = ((os.path.abspath(n), s) for n, s in _lines.items())
    rows = [f"L\\t{n}\\t{','.join(map(str, sorted(s)))}\\n" for n, s in lines]
    reached = {}
    for code in _called:
        numbers = reached.setdefault(os.path.abspath(code.co_filename), set())
        numbers.update(n for _, _, n in code.co_lines() if n)
    rows += [f"F\\t{n}\\t{','.join(map(str, sorted(s)))}\\n" for n, s in reached.items()]
    rows += [
        "X\\t"
        + "\\t".join((kind, os.path.abspath(n), name, os.path.abspath(c) if c else "", str(at)))
        + "\\n"
        for kind, n, name, c, at in _raised
    ]
    try:
        with open(_out, "a") as out:
            out.write("".join(rows))
    except OSError:
        pass


if _root and _out:
    sys.settrace(_call)
    threading.settrace(_call)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    atexit.register(_write)
'''
"""The `sitecustomize.py` that records, in each process, the lines run (a line tracer) and the
functions called (a profile hook, kept when a coverage tool in the test command takes the
line tracer's place), both in files under the root (Python 3.10 and later: `co_lines`)."""
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def traced(argv: Sequence[str], root: str) -> tuple[list[str], dict[str, str]]:
    """`argv` run with the tracer: the command (the tracer's folder put before any
    `PYTHONPATH` the environment has) and the variables it reads."""
    folder = f"{root.rstrip('/')}/{TRACE_DIR}"
    wrapped = ["sh", "-c", 'PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}" exec "$@"', folder, *argv]
    return wrapped, {"BATON_TRACE_ROOT": root.rstrip("/") + "/",
                     "BATON_TRACE_OUT": f"{root.rstrip('/')}/{RECORD}"}  # fmt: skip


def executed(record: str, root: str, tests: Sequence[str] = ()) -> dict[str, set[int]] | None:
    """The lines each file under `root` ran, by path relative to it, from the tracer's
    `record`: the lines it traced, if they show a file of `tests` (the reproducing tests) ran;
    else, when something else took the line tracer's place (coverage in the test command),
    every line of the functions called, if those show it; else None, as when there is no record
    or it may have been cut."""
    if not record.strip() or len(record) >= MAX_RECORD_CHARS:
        return None
    prefix = root.rstrip("/") + "/"
    found: dict[str, dict[str, set[int]]] = {"L": {}, "F": {}}
    for row in record.splitlines():
        kind, _, rest = row.partition("\t")
        name, _, numbers = rest.partition("\t")
        if kind not in found or not name.startswith(prefix) or not numbers:
            continue
        ran = found[kind].setdefault(name[len(prefix) :], set())
        ran.update(int(n) for n in numbers.split(",") if n.isdigit() and int(n) > 0)
    for kind in ("L", "F"):
        if not tests or any(test in found[kind] for test in tests):
            return found[kind]
    return None


@dataclass(frozen=True)
class Raised:
    """An exception a function of the repository let out to its caller, as the tracer saw."""

    error: str
    """The exception's type, by its name (`ValueError`, `TOMLDecodeError`)."""
    path: str
    function: str
    caller: str | None
    """The file of the function it was let out to, under the root; None outside it (the test
    runner's code, say)."""
    kinds: tuple[str, ...] = ()
    """The names of the types it is an instance of, its own type's first (`TOMLDecodeError`,
    `ValueError`, `Exception`, `BaseException`); empty when the tracer did not say."""
    line: int = 0
    """The line of the caller's file it arrived at (the call); 0 when unknown."""

    def describe(self) -> str:
        return f"{self.error} out of {self.function} ({self.path})"

    def is_a(self, name: str) -> bool:
        """Whether it is a `name` (a type's own name, without a module), itself or by a base:
        an `except name` would catch it."""
        return type_name(name) in {type_name(kind) for kind in (self.error, *self.kinds)}


def raised(record: str, root: str) -> list[Raised]:
    """The exceptions functions in files under `root` let out, from the tracer's `record`
    (none when it may have been cut), sorted."""
    if len(record) >= MAX_RECORD_CHARS:
        return []
    prefix = root.rstrip("/") + "/"
    found = set()
    for row in record.splitlines():
        fields = row.split("\t")
        if len(fields) != 6 or fields[0] != "X" or not fields[2].startswith(prefix):
            continue
        _, kinds, path, function, caller, line = fields
        error, *bases = kinds.split(",")
        inside = caller[len(prefix) :] if caller.startswith(prefix) else None
        at = int(line) if line.isdigit() else 0
        found.add(Raised(error, path[len(prefix) :], function, inside, (error, *bases), at))
    return sorted(found, key=lambda r: (r.path, r.function, r.error, r.caller or "", r.line))


def touched_lines(section: str) -> set[int]:
    """The lines of the unchanged file one file's diff `section` touches: those it changes or
    removes, and for an insertion the lines either side of it, and past blank lines and
    comments the hunk shows there, the nearest code either side (which is what can run)."""
    touched: set[int] = set()
    text: dict[int, str] = {}  # what the hunks show of the unchanged file
    gaps: set[tuple[int, int]] = set()  # insertions, between two lines of the unchanged file
    old, replacing = 0, False
    for line in section.splitlines():
        hunk = _HUNK.match(line)
        if hunk:
            old, replacing = int(hunk.group(1)), False
            if hunk.group(2) == "0" and old:  # an insertion after line `old`
                gaps.add((old, old + 1))
                old += 1
            continue  # (`-0,0`: a new file, whose lines the unchanged code never had)
        if not old:  # the file's header, or a new file's lines
            continue
        if line.startswith("-"):
            touched.add(old)
            text[old] = line[1:]
            old, replacing = old + 1, True
        elif line.startswith("+") and not replacing:  # inserted between old - 1 and old
            gaps.add((old - 1, old))
        elif line.startswith(" "):
            text[old] = line[1:]
            old, replacing = old + 1, False
    for gap in gaps:
        touched.update({*gap, *_nearest_code(gap, text)})
    return {n for n in touched if n > 0}


def _nearest_code(gap: tuple[int, int], text: Mapping[int, str]) -> tuple[int, int]:
    """The lines either side of an insertion between `gap`'s two, past those `text` shows are
    blank or comments."""
    before, after = gap
    while _inert(text.get(before)) and before > 1:
        before -= 1
    while _inert(text.get(after)):
        after += 1
    return before, after


def _inert(line: str | None) -> bool:
    """A line the hunk shows that no tracer sees run: blank, or only a comment."""
    return line is not None and (not line.strip() or line.lstrip().startswith("#"))


def off_path(
    sections: Mapping[str, str],
    ran: Mapping[str, set[int]],
    named: Collection[str] | None = None,
) -> bool:
    """Whether the change (`sections`: each changed code file's diff) certainly touches no
    line the run executed (`ran`): False as soon as one does, and whenever that cannot be told
    (a file that is not Python, which the tracer does not see). A new Python file, which the
    unchanged code could not run, is on the path when its module (`module_name`) is among
    those a line that ran outside the tests names (`named`), as an import of it would; without
    `named`, that cannot be told."""
    touched = {path: touched_lines(section) for path, section in sections.items()}
    if not touched:
        return False
    for path, lines in touched.items():
        if not path.endswith(".py") or lines & ran.get(path, set()):
            return False
        if not lines and (not creates(sections[path]) or named is None):
            return False  # a new file that cannot be judged, or one only renamed, say
        if not lines and module_name(path) in (named or ()):
            return False
    return True


def module_name(path: str) -> str:
    """The last part of the name a new Python file is imported by: `pkg/compat.py` → `compat`,
    `pkg/compat/__init__.py` → `compat`."""
    parts = path.removesuffix(".py").split("/")
    return parts[-2] if parts[-1] == "__init__" and len(parts) > 1 else parts[-1]


def creates(section: str) -> bool:
    """Whether a file's diff `section` makes a new file."""
    head = section.split("\n@@", 1)[0]
    return "new file mode" in head or "--- /dev/null" in head or section.startswith("@@ -0,0 ")

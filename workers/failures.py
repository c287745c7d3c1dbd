"""What a failing test's output says it raised, and through which functions.

Read from the forms runners print a failure in: Python's own traceback (unittest, plain
`python`, pytest's `--tb=native`), pytest's long form (`tests/test_a.py:12: ZeroDivisionError`)
and its short summary (`FAILED tests/test_a.py::test_x - ZeroDivisionError: …`), and Node's
`TypeError: …` with its `at f (file:line:col)` frames.
"""

from __future__ import annotations

import re

from orchestrator.core.reported import type_name

_NAME = r"[A-Za-z_$][\w$]*"
_RAISED_FORMS = (
    # the exception's line that ends a Python traceback (the header is at the same indentation)
    re.compile(
        r"^([ \t]*)Traceback \(most recent call last\):\n(?:\1[ \t]+.*\n|\1\n)*?"
        r"\1([A-Za-z_][\w.]*)(?::[ \t]|:?[ \t]*$)",
        re.MULTILINE,
    ),
    # pytest's long form: where it was raised, then the type
    re.compile(r"^()[^\s:][^:\n]*:\d+: ([A-Za-z_][\w.]*)[ \t]*$", re.MULTILINE),
    # pytest's short summary
    re.compile(r"^()(?:FAILED|ERROR) \S+ - ([A-Za-z_][\w.]*)(?::|[ \t]*$)", re.MULTILINE),
    # Node's error line (jest and mocha indent it)
    re.compile(r"^([ \t]*)([A-Z][\w$]*(?:Error|Exception)):", re.MULTILINE),
)


def raised_types(output: str) -> list[str]:
    """The exception types `output` shows raised, by their own names (no module), each once,
    in the order they first show."""
    found: dict[int, str] = {}
    for form in _RAISED_FORMS:
        for match in form.finditer(output):
            found.setdefault(match.start(2), type_name(match.group(2)))
    return list(dict.fromkeys(found[start] for start in sorted(found)))


def on_stack(output: str, function: str) -> bool:
    """Whether a stack `output` prints passes through `function`: a Python traceback's
    `File "…", line N, in function`, or Node's `at function (` / `at Owner.function (`."""
    name = re.escape(function)
    python = rf'^[ \t]*File "[^"\n]+", line \d+, in {name}[ \t]*$'
    node = rf"^[ \t]*at (?:(?:new )?{_NAME}\.)*{name} \("
    return re.search(f"{python}|{node}", output, re.MULTILINE) is not None

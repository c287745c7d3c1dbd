"""Whether a change answers its tests instead of fixing the code: an added branch that compares
against a value the reproducing tests use and returns a constant (`if n == 7: return 42`).

A branch the change adds (its `if` line is an added line) is a *special case* when its
condition compares (`==`, `is`, `in`) against a literal that the reproducing test files also
hold, and what it returns is a constant: a literal, or a call of a name on literals only
(`iter([])`). Literals too common to tell anything are not counted: None, True, False, 0, 1,
-1, "", and empty containers. Only Python files are judged.

This is a check on one shape of a wrong fix, not on every one: a branch that computes its
answer, or compares against a value built at run time, is not seen (an independent review is
meant to catch those).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from typing import Any

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
TRIVIAL = (None, True, False, 0, 1, -1, "", b"", 0.0)
MAX_SHOWN_CHARS = 80


def added_lines(section: str) -> set[int]:
    """The lines of the changed file that one file's diff `section` adds (new-side numbers)."""
    added: set[int] = set()
    new = 0
    for line in section.splitlines():
        hunk = _HUNK.match(line)
        if hunk:
            new = int(hunk.group(1))
            continue
        if not new:  # the file's header, before its first hunk
            continue
        if line.startswith("+"):
            added.add(new)
            new += 1
        elif line.startswith(" "):
            new += 1
    return added


def _value(node: ast.AST) -> Any:
    """The literal `node` spells, or raises ValueError."""
    return ast.literal_eval(node)


def _key(value: Any) -> str | None:
    """A comparable key for a literal worth telling by; None for a trivial one."""
    if isinstance(value, (list, tuple, set, dict, frozenset)) and not value:
        return None
    if any(type(value) is type(t) and value == t for t in TRIVIAL if t is not None):
        return None
    if value is None:
        return None
    return f"{type(value).__name__}:{value!r}"


def _literals(node: ast.AST) -> Iterator[Any]:
    """Every literal in `node`: constants, and containers of constants as a whole."""
    for child in ast.walk(node):
        if isinstance(child, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp)):
            try:
                yield _value(child)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue


def literals_of_tests(texts: Mapping[str, str | None]) -> set[str]:
    """The keys (`_key`) of the non-trivial literals the test files `texts` hold."""
    keys: set[str] = set()
    for text in texts.values():
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for value in _literals(tree):
            keys |= {k for k in _keys(value) if k is not None}
    return keys


def _keys(value: Any) -> list[str | None]:
    """A literal's key, and its elements' when it is a flat container."""
    found = [_key(value)]
    if isinstance(value, (list, tuple, set, frozenset)):
        found += [_key(v) for v in value if not isinstance(v, (list, tuple, set, dict))]
    return found


def _compared(test: ast.AST) -> set[str]:
    """Keys of the literals a condition compares against with `==`, `is` or `in`."""
    keys: set[str] = set()
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, (ast.Eq, ast.Is, ast.In)) for op in node.ops):
            continue
        for operand in (node.left, *node.comparators):
            try:
                value = _value(operand)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
            keys |= {k for k in _keys(value) if k is not None}
    return keys


def _constant(node: ast.AST | None) -> bool:
    """Whether `node` is a constant: a literal, a call of a plain name on constants, or a
    choice between constants (`"a" if flag else "b"`)."""
    if node is None:
        return False
    if isinstance(node, ast.IfExp):
        return _constant(node.body) and _constant(node.orelse)
    try:
        _value(node)
        return True
    except (ValueError, TypeError, SyntaxError, RecursionError):
        pass
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and not node.keywords
        and all(_constant(arg) for arg in node.args)
    )


def special_cases(
    code: Mapping[str, str | None], sections: Mapping[str, str], tests: Mapping[str, str | None]
) -> list[str]:
    """The special cases (module docstring) the change adds: `path:line: condition`, for
    each Python file of `code` (its text with the change) whose diff is in `sections`, judged
    against the reproducing test files' texts `tests`."""
    wanted = literals_of_tests(tests)
    found: list[str] = []
    for path, text in code.items():
        if not path.endswith(".py") or text is None or path not in sections:
            continue
        added = added_lines(sections[path])
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.If) or node.lineno not in added:
                continue
            if not (_compared(node.test) & wanted):
                continue
            returns = [s for s in node.body if isinstance(s, ast.Return)]
            if returns and all(_constant(r.value) for r in returns):
                shown = ast.unparse(node.test)[:MAX_SHOWN_CHARS]
                found.append(f"{path}:{node.lineno}: `if {shown}`")
    return found

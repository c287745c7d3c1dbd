"""Whether a change changes code that runs, or only comments, whitespace and docstrings.

A fix that only adds a comment (a marker its own test looks for), reflows lines or rewrites a
docstring cannot be the fix of a failure: nothing runs differently. The proof refuses it
(`workers.proof`), comparing each changed file's code before and after with what does not run
taken out:

- Python: the syntax trees, without docstrings and other bare string statements (which are
  no-ops); comments, blank lines and layout never reach the tree;
- the C family (C, C++, Java, JavaScript, TypeScript, Go, Rust, C#, Kotlin, Swift, Scala):
  the text without `//` and `/* */` comments, and outside string literals without whitespace
  except one space between two words.

- Cython (`.pyx`, `.pxd`, `.pxi`): the text without `#` comments outside string literals,
  trailing whitespace and blank lines (its docstrings are kept: Python's parser cannot read it).

Any other kind of file (data, templates, configuration), a file that does not parse, and a
file that is not text count as changed code: what cannot be judged is not refused.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import PurePosixPath

PYTHON = frozenset({".py", ".pyi"})
C_FAMILY = frozenset({
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx", ".java", ".js", ".jsx", ".mjs",
    ".cjs", ".ts", ".tsx", ".mts", ".cts", ".go", ".rs", ".cs", ".kt", ".kts", ".swift",
    ".scala",
})  # fmt: skip
CYTHON = frozenset({".pyx", ".pxd", ".pxi"})
QUOTES = "\"'`"


def code_unchanged(path: str, before: str | None, after: str | None) -> bool:
    """Whether `path`'s change from `before` to `after` (None: the file is absent) alters only
    what never runs; False whenever that cannot be told."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in PYTHON:
        shape = _python_code
    elif suffix in C_FAMILY:
        shape = _c_family_code
    elif suffix in CYTHON:
        shape = _hash_commented_code
    else:
        return False
    old, new = shape(before or ""), shape(after or "")
    return old is not None and old == new


def only_inert(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[str]:
    """The paths (keys of `after`) whose change alters no code that runs, if that is all of
    them; [] when any one changes code (or there are none)."""
    inert = [p for p in after if code_unchanged(p, before.get(p), after[p])]
    return inert if after and len(inert) == len(after) else []


def _python_code(text: str) -> str | None:
    """The syntax tree of `text` without bare string statements (docstrings among them), as
    text; None if it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        for field, block in ast.iter_fields(node):
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                kept = [s for s in block if not _bare_string(s)]
                setattr(node, field, kept or [ast.Pass()])
    return ast.dump(tree, include_attributes=False)


def _bare_string(statement: object) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _c_family_code(text: str) -> str:
    """`text` without `//` and `/* */` comments, and outside string literals without
    whitespace but one space between two words (`int x`, `return 1`)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in QUOTES:
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = n if close < 0 else close + 2
            _space(out)  # a comment separates what is either side of it
        elif c.isspace():
            while i < n and text[i].isspace():
                i += 1
            _space(out)
        else:
            out.append(c)
            i += 1
    kept = [
        piece
        for k, piece in enumerate(out)
        if piece != " " or (0 < k < len(out) - 1 and _word(out[k - 1][-1]) and _word(out[k + 1][0]))
    ]
    return "".join(kept)


def _word(c: str) -> bool:
    """Whether `c` can be part of a name or number, which a space must keep apart."""
    return c.isalnum() or c in "_$"


def _space(out: list[str]) -> None:
    if out and out[-1] != " ":
        out.append(" ")


def _hash_commented_code(text: str) -> str:
    """`text` without `#` comments outside string literals, trailing whitespace and blank
    lines (Cython: its indentation is kept, since it is code)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else c
            end = text.find(quote, i + len(quote)) if len(quote) == 3 else _string_end(text, i)
            end = n if end < 0 else end + (3 if len(quote) == 3 else 0)
            out.append(text[i:end])
            i = end
        elif c == "#":
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        else:
            out.append(c)
            i += 1
    lines = (line.rstrip() for line in "".join(out).splitlines())
    return "\n".join(line for line in lines if line)


def _string_end(text: str, start: int) -> int:
    """Where the string literal opening at `start` ends (after its closing quote; a quote
    escaped by a backslash does not close it; an unclosed one ends with the line, or the text
    for a template literal)."""
    quote, i, n = text[start], start + 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return i + 1
        if c == "\n" and quote != "`":
            return i
        i += 1
    return n

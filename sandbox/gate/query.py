"""Query strings: what each request may carry, read once and written again canonically.

dockerd reads a parameter with `r.Form.Get` (the first of several values) and a flag with its
`BoolValue` (anything but "", "0", "no", "false", "none" is true, after trimming and
lower-casing). The gate accepts each parameter a route names at most once, checks its value,
and forwards only the ones it checked, written its own way (`1`/`0` for flags); a parameter
a route does not name (`changes` on a commit, `checkpoint-dir` on a start, …) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl

from sandbox.gate.errors import Refused

Param = Callable[[str], "str | None"]
"""A parameter's check: its value as forwarded, or None to leave it out; `Refused` if wrong."""
FALSE_FLAGS = frozenset({"", "0", "no", "false", "none"})
INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
"""What Go's `strconv.Atoi` reads, short enough to stay within an int64."""


def flag(value: str) -> str:
    return "0" if value.strip().lower() in FALSE_FLAGS else "1"


def false_flag(value: str) -> None:
    """A flag accepted only when false, and left out (docker-py sends `link=False`)."""
    if flag(value) != "0":
        raise Refused(f"the flag is {value[:20]!r}: only false is accepted")
    return None


def ignored(value: str) -> None:
    """A parameter docker-py sends that dockerd does not read (`trunc_cmd`): left out."""
    return None


def integer(value: str) -> str:
    if not INTEGER.fullmatch(value):
        raise Refused(f"{value[:20]!r} is not an integer")
    return str(int(value))


def matching(pattern: str, what: str) -> Param:
    """A text parameter that must match `pattern` whole (`what` names it in a refusal)."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise Refused(f"{value[:60]!r} is not {what}")
        return value

    return check


def text(value: str) -> str:
    """Any text without control characters (a path in the container, a time)."""
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise Refused("it holds a control character")
    return value


def read(query: str, params: Mapping[str, Param]) -> dict[str, str]:
    """`query` read as dockerd would, each parameter checked; what the gate forwards."""
    found: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        check = params.get(name)
        if check is None:
            raise Refused(f"the query parameter {name[:40]!r} is not one the gate forwards here")
        if name in found:
            raise Refused(f"the query parameter {name!r} is given twice")
        found[name] = value
    forwarded = {}
    for name, value in found.items():
        try:
            kept = params[name](value)
        except Refused as exc:
            raise Refused(f"the query parameter {name!r}: {exc.reason}") from None
        if kept is not None:
            forwarded[name] = kept
    return forwarded

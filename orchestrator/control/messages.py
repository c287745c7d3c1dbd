"""How a failure reads to the person at the `baton` command: a plain sentence naming what was
wrong and what to do, never a Python class name or a traceback.

Baton's own errors (`BatonError`) carry such a sentence already. Two failures come from
libraries and are common enough to say plainly too: a setting that does not validate (pydantic
names the model class and links to its docs) and a Redis that does not answer (redis-py raises
its `ConnectionError`). Anything else is a bug, and its traceback is what a bug report needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.exceptions
from pydantic import ValidationError

from orchestrator.core.errors import BatonError
from orchestrator.core.settings import Settings

EXIT_BAD_INPUT = 2
"""What a command exits with when what it was given (arguments, a file, a setting) is wrong."""
EXIT_UNREACHABLE = 3
"""What a command exits with when Redis does not answer: nothing was wrong with the request."""
EXIT_AWAITING_APPROVAL = 4
"""What `baton watch` exits with when the run parks at a gate: it goes on only once a person
runs `baton approve` (or ends with `baton reject`), so there is nothing more to watch."""


@dataclass(frozen=True)
class Complaint:
    """What to tell the user, and the exit status."""

    message: str
    exit_code: int


def complaint(exc: BaseException) -> Complaint | None:
    """The message and exit status `exc` ends a command with; None for a failure that is not
    the user's to fix (a bug: let its traceback show)."""
    if isinstance(exc, BatonError):
        return Complaint(str(exc), EXIT_BAD_INPUT)
    if isinstance(exc, ValidationError):
        return Complaint(_invalid(exc), EXIT_BAD_INPUT)
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        said = str(exc).strip() or "no answer"
        return Complaint(
            f"Redis does not answer at BATON_REDIS_URL ({said}); start it, or point "
            "BATON_REDIS_URL at the Redis your workers use",
            EXIT_UNREACHABLE,
        )
    return None


def _invalid(exc: ValidationError) -> str:
    """`setting queue.run_ttl_s (BATON_QUEUE__RUN_TTL_S): Input should be …`, one per error.
    (pydantic's own text starts with the model's class name; the input is never repeated: it
    may be a secret.)"""
    said = []
    for detail in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in detail["loc"]) or "the value"
        if exc.title == Settings.__name__ and detail["loc"]:
            where = f"{where} ({_variable(detail['loc'])})"
        said.append(f"{where}: {detail['msg']}")
    noun = "a setting is" if exc.title.endswith("Settings") else "a value is"
    return f"{noun} not valid: " + "; ".join(said)


def _variable(loc: tuple[int | str, ...]) -> str:
    """The environment variable that sets the field at `loc` of `Settings`."""
    return "BATON_" + "__".join(str(part) for part in loc).upper()

"""Where an execution's wall time goes: the phases Baton times inside one, summed in seconds.

An execution (`workers.execution.Execution`) opens `recording()` around its work, and the code
that does a phase worth knowing wraps it in `timed(phase)`: `Entered` for a context manager
whose entry and exit are two phases (a sandbox's start and removal), `timed_iteration` for a
model's reply, which counts the waits for each part and not what the caller does between parts
(ADK runs the tools a reply asks for before it reads on). Whatever else the stage's task does,
from its claim to the record of how it ended, is Baton's own time. The sums are written on the
run's audit log as one entry of kind `AUDIT_KIND` as the execution ends (`Timings.entry`), where
`baton log` and the run-anatomy benchmark (bench/anatomy.py) read them.

A phase timed inside another pauses the outer one (a tool's test run counts as a command, not
as the tool's), so the phases never overlap and their sum is at most the execution's wall
time. Outside a recording (a unit test's stage, the eval harness's measuring sandbox) timing
records nothing. A recording travels in a context variable, so it follows its
execution into the asyncio tasks and `asyncio.to_thread` calls it makes, and never mixes with
another execution's in the same process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

ENVIRONMENT = "environment_s"
"""Finding the run's environment image (building it, the first time, fleet-wide)."""
SANDBOX_START = "sandbox_start_s"
"""Creating and starting a sandbox container, or taking a warm one."""
COPY_IN = "copy_in_s"
"""Putting the commit's tree in a sandbox: its archive from the host's mirror, the copy into the
container, and the baseline commit that diffs are taken against."""
BUILD = "build_s"
"""The environment's build step before a command (`workers.rebuild`), its check included."""
COMMANDS = "commands_s"
"""Commands run through `Workspace.run`: the test runs of the tools, Baton's verification and
proof runs, command tools."""
MODEL = "model_s"
"""Inside the model client: from sending a request to receiving each part of its reply."""
CHANGES = "changes_s"
"""Applying a patch in a sandbox and taking its diff (git there): an earlier stage's change, the
change under proof, the model's patches and diffs."""
TOOLS = "tools_s"
"""The built-in code tools the model called (`workers.tools.code`): reading, searching and
editing files in the sandbox, publishing; their test runs are `COMMANDS`, their patches and
diffs `CHANGES`."""
SANDBOX_STOP = "sandbox_stop_s"
"""Removing a sandbox (its container and its workspace volume)."""
PHASES = (ENVIRONMENT, SANDBOX_START, COPY_IN, BUILD, COMMANDS, CHANGES, TOOLS, MODEL, SANDBOX_STOP)
AUDIT_KIND = "timings"
ROUND_TO = 4
"""Decimals of a second an entry keeps (a tenth of a millisecond)."""


class Timings:
    """The seconds one execution spent in each phase so far."""

    def __init__(self) -> None:
        self.spent_s: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._lock = threading.Lock()  # an execution's threads may add at once

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.spent_s[phase] += seconds

    def entry(self, labels: Mapping[str, str], **data: Any) -> dict[str, Any]:
        """The audit entry of these timings: `labels` (stage, branch, session), and as its data
        each phase's seconds with `data` (the iteration, say)."""
        spent = {phase: round(seconds, ROUND_TO) for phase, seconds in self.spent_s.items()}
        return {**labels, "ts": repr(time.time()), "kind": AUDIT_KIND, "data": {**data, **spent}}


clock = time.perf_counter
"""The seconds `timed` reads (tests give it a clock of their own)."""


@dataclass
class _Open:
    """The innermost phase being timed, and since when (`clock`) it has been counting."""

    phase: str
    since: float


_current: ContextVar[Timings | None] = ContextVar("baton_timings", default=None)
_open: ContextVar[_Open | None] = ContextVar("baton_timed_phase", default=None)


@contextmanager
def recording() -> Iterator[Timings]:
    """Time the phases of the code this block runs (and what it starts) into a new `Timings`."""
    timings = Timings()
    token, outside = _current.set(timings), _open.set(None)
    try:
        yield timings
    finally:
        _open.reset(outside)
        _current.reset(token)


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the block's wall time to `phase` of the recording this runs in, if any. A phase
    timed inside another pauses it: each second counts once, for the innermost phase (a
    tool's test run is the tool's commands, not the tool's)."""
    timings = _current.get()
    if timings is None:
        yield
        return
    outer, began = _open.get(), clock()
    if outer is not None:
        timings.add(outer.phase, began - outer.since)
    inner = _Open(phase, began)
    token = _open.set(inner)
    try:
        yield
    finally:
        ended = clock()
        timings.add(phase, ended - inner.since)
        _open.reset(token)
        if outer is not None:
            outer.since = ended


class Entered(AbstractContextManager[T]):
    """`manager`, its entry timed as `start` and its exit as `stop`; what it does with an
    exception is unchanged."""

    def __init__(self, manager: AbstractContextManager[T], *, start: str, stop: str) -> None:
        self._manager, self._start, self._stop = manager, start, stop

    def __enter__(self) -> T:
        with timed(self._start):
            return self._manager.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        with timed(self._stop):
            return self._manager.__exit__(*exc)


async def timed_iteration(phase: str, parts: AsyncIterable[T]) -> AsyncIterator[T]:
    """`parts` as they come, the wait for each added to `phase`."""
    iterator = aiter(parts)
    try:
        while True:
            with timed(phase):
                try:
                    part = await anext(iterator)
                except StopAsyncIteration:
                    return
            yield part
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()

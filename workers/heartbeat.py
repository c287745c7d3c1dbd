"""A running stage's heartbeat: renews its lease and notices when the stage must stop (its run
was cancelled, or another execution took the stage over).

It renews every third of the lease, so it notices late by design; what must never happen after
a cancel (a push, a recorded output) is fenced where it happens (`workers.execution`), not here.
The heartbeat's job is to interrupt a stage that is blocked (in a model call, in a command in
its sandbox) and to remove its sandbox."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from orchestrator.core.execution import Hold
from workers.holding import Holding

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Heartbeat:
    """Renews the lease of what an execution holds (a stage or a branch, `holding`) every third
    of `lease_s`, for a `with` block, from the process's one heartbeat thread (`_Beater`): a
    stage does not start and join a thread of its own.

    When the execution no longer holds its stage (`hold` is `CANCELLED` or `LOST`), `stopped`
    is set and `on_stop` runs once (it stops whatever the stage is blocked in, such as its
    sandbox).
    """

    def __init__(self, holding: Holding, *, lease_s: float, on_stop: Callable[[], None]) -> None:
        self._holding = holding
        self._lease_s = lease_s
        self._on_stop = on_stop
        self._beating = threading.Lock()
        """Held while a beat of this heartbeat runs: leaving the block waits for it."""
        self._active = False
        self.stopped = threading.Event()
        self.hold = Hold.HELD

    @property
    def every_s(self) -> float:
        return self._lease_s / 3

    def __enter__(self) -> Heartbeat:
        self._active = True
        _beater().add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        _beater().remove(self)
        if self._beating.acquire(timeout=self._lease_s):  # a beat under way ends first
            self._beating.release()

    def beat(self) -> bool:
        """Renew the lease once; False once the execution no longer holds its stage (no more
        beats are needed)."""
        with self._beating:
            if not self._active:  # its block has been left meanwhile
                return False
            held = self._holding.held
            try:
                hold = self._holding.renew(self._lease_s)
            except Exception:
                logger.warning("could not renew the lease of %s", self._holding.owner,
                               exc_info=True)  # fmt: skip
                return True
            if hold != Hold.HELD and not self.stopped.is_set():
                logger.info("stage %s of run %s: %s; stopping", held, held.run_id, hold)
                self.hold = hold
                self.stopped.set()
                self._on_stop()
                return False
            return hold == Hold.HELD


class _Beater:
    """The thread that beats every running heartbeat of this process when it is due. Started
    on first use and kept for the process's life (it waits on a condition while no stage
    runs); a forked child makes its own (`_beater`)."""

    def __init__(self) -> None:
        self._due: dict[Heartbeat, float] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._due[heartbeat] = time.monotonic() + heartbeat.every_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="baton-heartbeat", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._due.pop(heartbeat, None)

    def _run(self) -> None:
        while True:
            for heartbeat in self._next_due():
                try:
                    going = heartbeat.beat()
                except Exception:  # its `on_stop` failed: the others beat on
                    logger.exception("a heartbeat's stop failed")
                    going = False
                if not going:
                    self.remove(heartbeat)

    def _next_due(self) -> list[Heartbeat]:
        """Wait until a heartbeat is due; the due ones, rescheduled for their next beat."""
        with self._changed:
            while True:
                now = time.monotonic()
                due = [h for h, at in self._due.items() if at <= now]
                if due:
                    for heartbeat in due:
                        self._due[heartbeat] = now + heartbeat.every_s
                    return due
                wait_s = min(self._due.values(), default=now + 3600) - now
                self._changed.wait(wait_s)


@functools.cache
def _beater() -> _Beater:
    """This process's beater; a forked child (a pool process) gets a new one, as the parent's
    thread does not run in it."""
    return _Beater()


os.register_at_fork(after_in_child=_beater.cache_clear)


class Interruptible:
    """Runs a coroutine to completion, cancellable from another thread (the heartbeat's): a
    cancelled stage stops at whatever it awaits, a model call included.

    With `loop`, every run uses that one event loop (a worker process's, so that its stages
    share HTTP connections); what a run leaves scheduled on it is cancelled when it ends, as
    `asyncio.run` would. Without, each run gets a new loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._running: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        async def main() -> T:
            self._running, self._task = asyncio.get_running_loop(), asyncio.current_task()
            return await coroutine

        if self._loop is None:
            return asyncio.run(main())
        try:
            return self._loop.run_until_complete(main())
        finally:
            self._running = None
            _cancel_leftovers(self._loop)

    def cancel(self) -> None:
        loop, task = self._running, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed: the stage finished, nothing to stop
                pass


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a finished run left on `loop` and let them finish cancelling."""
    leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not leftovers:
        return
    for task in leftovers:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))

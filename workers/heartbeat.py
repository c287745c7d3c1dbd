"""A running stage's heartbeat: renews its lease and notices when the stage must stop (its run
was cancelled, or another execution took the stage over).

It renews every third of the lease, so it notices late by design; what must never happen after
a cancel (a push, a recorded output) is fenced where it happens (`workers.execution`), not here.
The heartbeat's job is to interrupt a stage that is blocked (in a model call, in a command in
its sandbox) and to remove its sandbox."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from orchestrator.conductor import Conductor
from orchestrator.execution import Hold

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Heartbeat:
    """Renews the owner's lease every third of `lease_s` from a thread, for a `with` block.

    When the execution no longer holds its stage (`hold` is `CANCELLED` or `LOST`), `stopped`
    is set and `on_stop` runs once (it stops whatever the stage is blocked in, such as its
    sandbox).
    """

    def __init__(
        self,
        conductor: Conductor,
        run_id: str,
        stage: str,
        *,
        owner: str,
        lease_s: float,
        on_stop: Callable[[], None],
    ) -> None:
        self._conductor = conductor
        self._run_id, self._stage, self._owner = run_id, stage, owner
        self._lease_s = lease_s
        self._on_stop = on_stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self.hold = Hold.HELD

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name="baton-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._lease_s)

    def _beat(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            try:
                hold = self._conductor.renew(
                    self._run_id, self._stage, owner=self._owner, lease_s=self._lease_s
                )
            except Exception:
                logger.warning("could not renew the lease of %s", self._owner, exc_info=True)
                continue
            if hold != Hold.HELD and not self.stopped.is_set():
                logger.info("stage %s of run %s: %s; stopping", self._stage, self._run_id, hold)
                self.hold = hold
                self.stopped.set()
                self._on_stop()
                return


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

"""Interruptible: a stage's coroutine, stoppable from the heartbeat's thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from workers.heartbeat import Interruptible


def test_a_cancel_from_another_thread_stops_the_coroutine_at_its_await() -> None:
    execution, started = Interruptible(), threading.Event()

    async def stage() -> str:
        started.set()
        await asyncio.sleep(30)
        return "finished"

    threading.Thread(target=lambda: started.wait(5) and execution.cancel()).start()
    with pytest.raises(asyncio.CancelledError):
        execution.run(stage())


def test_a_cancel_after_the_stage_finished_is_harmless() -> None:
    execution = Interruptible()

    async def stage() -> str:
        return "finished"

    assert execution.run(stage()) == "finished"
    execution.cancel()  # the heartbeat noticed the cancel just after the stage ended

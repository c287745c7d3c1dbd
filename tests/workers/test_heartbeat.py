"""Heartbeat: leases renewed from one thread per process; Interruptible: a stage's coroutine,
stoppable from that thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from orchestrator.core.execution import Held, Hold
from workers.heartbeat import Heartbeat, Interruptible


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


class ScriptedHolding:
    """Answers `renew` with `holds` in turn (the last one from then on), counting the calls."""

    held = Held("run", "stage")
    owner = "me"

    def __init__(self, *holds: Hold) -> None:
        self.holds, self.renewed = list(holds), 0

    def renew(self, lease_s: float) -> Hold:
        self.renewed += 1
        return self.holds.pop(0) if len(self.holds) > 1 else self.holds[0]


def heartbeat(holding: ScriptedHolding, on_stop: Callable[[], None] = lambda: None) -> Heartbeat:
    return Heartbeat(holding, lease_s=LEASE_S, on_stop=on_stop)  # type: ignore[arg-type]


LEASE_S = 0.06
"""A beat every 20 ms."""


def test_a_heartbeat_renews_while_its_block_runs_and_never_after() -> None:
    holding = ScriptedHolding(Hold.HELD)
    with heartbeat(holding):
        time.sleep(5 * LEASE_S)
    renewed = holding.renewed
    time.sleep(3 * LEASE_S)
    assert renewed >= 3
    assert holding.renewed == renewed


def test_a_cancelled_stage_is_stopped_once_and_beats_no_more() -> None:
    holding, stops = ScriptedHolding(Hold.HELD, Hold.CANCELLED), []
    with heartbeat(holding, on_stop=lambda: stops.append(1)) as beating:
        assert beating.stopped.wait(10 * LEASE_S)
        time.sleep(3 * LEASE_S)
    assert (beating.hold, stops, holding.renewed) == (Hold.CANCELLED, [1], 2)


def test_the_stages_of_a_process_share_one_heartbeat_thread_and_each_beats() -> None:
    first, second = ScriptedHolding(Hold.HELD), ScriptedHolding(Hold.HELD)
    with heartbeat(first), heartbeat(second):
        time.sleep(5 * LEASE_S)
    for _ in range(20):
        with heartbeat(ScriptedHolding(Hold.HELD)):
            pass
    threads = [t for t in threading.enumerate() if t.name == "baton-heartbeat"]
    assert len(threads) == 1
    assert first.renewed >= 3 and second.renewed >= 3


def test_a_failing_stop_does_not_stop_the_other_heartbeats() -> None:
    def fail() -> None:
        raise RuntimeError("the sandbox could not be removed")

    lost, held = ScriptedHolding(Hold.LOST), ScriptedHolding(Hold.HELD)
    with heartbeat(lost, on_stop=fail) as failing, heartbeat(held):
        assert failing.stopped.wait(10 * LEASE_S)
        renewed = held.renewed
        time.sleep(4 * LEASE_S)
    assert held.renewed > renewed

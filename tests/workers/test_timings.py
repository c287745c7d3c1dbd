"""An execution's phase timings (`workers.timings`), on a clock the test moves by hand: what each
phase counts, that nested phases never count a second twice, that executions never mix, and
that a sandbox workspace times its build step, commands and patches as theirs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import pytest

from sandbox import DockerSandbox, ExecResult
from workers import timings
from workers.rebuild import Rebuild
from workers.timings import (
    BUILD,
    CHANGES,
    COMMANDS,
    MODEL,
    SANDBOX_START,
    SANDBOX_STOP,
    TOOLS,
)
from workers.tools.container import ContainerWorkspace


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(timings, "clock", fake)
    return fake


def spent(recorded: timings.Timings) -> dict[str, float]:
    """The phases that counted anything."""
    return {phase: seconds for phase, seconds in recorded.spent_s.items() if seconds}


def test_blocks_of_a_phase_add_up_and_time_outside_them_counts_for_none(clock: Clock) -> None:
    with timings.recording() as recorded:
        with timings.timed(COMMANDS):
            clock.advance(1.5)
        clock.advance(7.0)  # Baton's own
        with timings.timed(COMMANDS):
            clock.advance(0.25)
        with timings.timed(MODEL):
            clock.advance(2.0)

    assert spent(recorded) == {COMMANDS: 1.75, MODEL: 2.0}


def test_a_phase_inside_another_pauses_it(clock: Clock) -> None:
    with timings.recording() as recorded, timings.timed(TOOLS):
        clock.advance(0.5)
        with timings.timed(COMMANDS):  # the tool runs the tests
            clock.advance(3.0)
        clock.advance(0.25)

    assert spent(recorded) == {TOOLS: 0.75, COMMANDS: 3.0}


def test_nothing_is_recorded_outside_a_recording_nor_after_it(clock: Clock) -> None:
    with timings.timed(COMMANDS):
        clock.advance(1.0)
    with timings.recording() as recorded:
        pass
    with timings.timed(COMMANDS):
        clock.advance(1.0)

    assert spent(recorded) == {}


def test_a_context_managers_entry_and_exit_are_two_phases_and_its_body_neither(
    clock: Clock,
) -> None:
    seen: list[object] = []

    @contextmanager
    def sandbox() -> Iterator[str]:
        clock.advance(0.5)  # created and started
        try:
            yield "box"
        except ValueError as exc:
            seen.append(exc)
            raise
        finally:
            clock.advance(0.125)  # removed

    with timings.recording() as recorded, pytest.raises(ValueError, match="in the body"):
        with timings.Entered(sandbox(), start=SANDBOX_START, stop=SANDBOX_STOP) as box:
            assert box == "box"
            clock.advance(10.0)
            raise ValueError("in the body")

    assert spent(recorded) == {SANDBOX_START: 0.5, SANDBOX_STOP: 0.125}
    assert [str(e) for e in seen] == ["in the body"]  # the manager saw the exception


def test_a_reply_counts_the_waits_for_its_parts_not_what_the_caller_does_between(
    clock: Clock,
) -> None:
    async def reply() -> AsyncIterator[str]:
        for part in ("a", "b"):
            clock.advance(0.25)
            yield part

    async def read() -> list[str]:
        parts = []
        async for part in timings.timed_iteration(MODEL, reply()):
            parts.append(part)
            clock.advance(5.0)  # ADK runs the tools the part asks for
        return parts

    with timings.recording() as recorded:
        assert asyncio.run(read()) == ["a", "b"]

    assert spent(recorded) == {MODEL: 0.5}


def test_a_recording_follows_its_execution_into_threads_and_not_into_anothers(
    clock: Clock,
) -> None:
    def run_tests(seconds: float) -> None:
        with timings.timed(COMMANDS):
            clock.advance(seconds)

    async def execution(seconds: float) -> timings.Timings:
        with timings.recording() as recorded:
            await asyncio.to_thread(run_tests, seconds)
            await asyncio.sleep(0)  # the other execution runs meanwhile
        return recorded

    async def both() -> list[timings.Timings]:
        return list(await asyncio.gather(execution(1.0), execution(2.0)))

    first, second = asyncio.run(both())

    assert (spent(first), spent(second)) == ({COMMANDS: 1.0}, {COMMANDS: 2.0})


def test_the_audit_entry_names_its_kind_and_labels_and_rounds_the_seconds(clock: Clock) -> None:
    with timings.recording() as recorded, timings.timed(COMMANDS):
        clock.advance(1.234567)

    entry = recorded.entry({"stage": "fix", "session": "r1:fix:1"}, iteration=2)

    assert (entry["kind"], entry["stage"], entry["session"]) == ("timings", "fix", "r1:fix:1")
    assert entry["data"]["iteration"] == 2
    assert entry["data"][COMMANDS] == 1.2346
    assert entry["data"][MODEL] == 0.0
    assert set(entry["data"]) == {"iteration", *timings.PHASES}


class SecondBox:
    """The part of `DockerSandbox` a `ContainerWorkspace` uses: every call takes one second of
    `clock` and succeeds, printing a word."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.calls = clock, 0

    def exec(self, argv: Sequence[str], **_: object) -> ExecResult:
        self.clock.advance(1.0)
        self.calls += 1
        return ExecResult(exit_code=0, output="abc\n", timed_out=False, oom_killed=False,
                          truncated=False, duration_s=1.0)  # fmt: skip

    def write_file(self, path: str, data: bytes) -> None:
        self.clock.advance(1.0)
        self.calls += 1


def test_a_workspace_times_its_build_step_its_commands_and_its_patches_apart(
    clock: Clock,
) -> None:
    box = SecondBox(clock)
    rebuild = Rebuild(["make"], stale=True)
    workspace = ContainerWorkspace(cast(DockerSandbox, box), root="/w", rebuild=rebuild)

    with timings.recording() as recorded:
        workspace.run(["pytest"], timeout_s=10)
        build_calls = box.calls - 1  # all but the command itself
        workspace.apply_patch("--- a/x\n+++ b/x\n")  # one exec: git apply reads it on stdin
        workspace.diff()  # one exec: intent to add, then the diff

    assert build_calls >= 2  # at least the check and the build command
    assert spent(recorded) == {BUILD: build_calls, COMMANDS: 1.0, CHANGES: 2.0}

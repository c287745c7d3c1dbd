"""Fences for tests: a stand-in for an execution's fence (`workers.stage.Fence`) that lets the
first calls through and stops the execution from a given call on, counting every call."""

from __future__ import annotations

from collections.abc import Callable


def failing_at(n: int, error: Callable[[], BaseException]) -> tuple[Callable[[], None], list[int]]:
    """A fence that raises `error()` from its `n`-th call on, and the list of its calls."""
    calls: list[int] = []

    def fence() -> None:
        calls.append(len(calls) + 1)
        if len(calls) >= n:
            raise error()

    return fence, calls

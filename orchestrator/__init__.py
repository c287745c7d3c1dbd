"""What a run is and where it goes, in two packages (docs/architecture.md):

- `orchestrator.core`: the run core — run records, pipeline specs, the store, the conductor, the
  queue, settings, errors, host-side git and the reconciler. The workers import only this.
- `orchestrator.control`: the control plane — the Python API, the `baton` command, inspection,
  `baton serve`, Flower, intake — what people and scripts use.

Never imports `workers`: stages are sent to their queues by task name. Importing a submodule
runs this file first, so it imports nothing: the names of the Python API below
(`from orchestrator import enqueue`) load the control plane only when one is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.control.api import (
        approve,
        cancel,
        enqueue,
        get_run,
        list_runs,
        reject,
        resume,
        submit,
    )

__all__ = ["approve", "cancel", "enqueue", "get_run", "list_runs", "reject", "resume", "submit"]


def __getattr__(name: str) -> Any:
    """The Python API's names, from `orchestrator.control.api` on first use (PEP 562)."""
    if name in __all__:
        from orchestrator.control import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

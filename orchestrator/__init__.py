"""What a run is and where it goes: intake, pipeline specs, run store, enqueue/advance, CLI.

Never imports `workers`: stages are sent to their queues by task name.
"""

from orchestrator.api import enqueue, get_run, submit

__all__ = ["enqueue", "get_run", "submit"]

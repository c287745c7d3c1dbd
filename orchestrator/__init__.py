"""What a run is and where it goes: intake, pipeline specs, run store, enqueue/advance, CLI.

Never imports `workers`: stages are sent to their queues by task name.
"""

from orchestrator.api import cancel, enqueue, get_run, list_runs, resume, submit

__all__ = ["cancel", "enqueue", "get_run", "list_runs", "resume", "submit"]

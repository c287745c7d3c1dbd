"""The reconciler: the final guarantee that no run is lost.

A broker can lose a message (a worker killed while holding it, Redis restarted between a
stage's record and its message, an ETA retry held by a dead worker). Once a stage has looked
stuck for long enough, the reconciler puts it back on its queue. Redelivered and duplicate
messages are harmless: `Conductor.begin` drops a delivery for a stage that is done or held
by a live execution.

    stage state   stuck when                                      action
    running       its lease lapsed (its worker is gone)           queued again, `interrupted` + 1
    queued        queued `stuck_after_s` ago, and its message is   sent again
                  in no queue nor delivered in that time
    waiting       `stuck_after_s` past its retry time             sent again
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core import keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import RunRecord, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.queue import stage_task_id
from orchestrator.core.settings import QueueConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Repair:
    """One stage the reconciler put back on its queue."""

    run_id: str
    stage: str
    was: str
    """The state it was stuck in."""


class Reconciler:
    """Sweeps the active runs for stages stuck in a non-terminal state."""

    def __init__(self, conductor: Conductor, queue: QueueConfig) -> None:
        self.conductor = conductor
        self.queue = queue

    def sweep_if_due(self, *, holder: str) -> list[Repair] | None:
        """Sweep unless another process swept within `reconcile_every_s` (a Redis lock)."""
        ttl_ms = int(self.queue.reconcile_every_s * 1000 * 0.9)
        if not self.conductor.store.redis.set(keys.RECONCILER_LOCK, holder, nx=True, px=ttl_ms):
            return None
        return self.sweep()

    def sweep(self, now: float | None = None) -> list[Repair]:
        now = time.time() if now is None else now
        repairs = []
        store = self.conductor.store
        # What the broker holds, read once per sweep and only if a stage has been queued long.
        held = functools.cache(
            lambda: self.conductor.dispatcher.held_task_ids(
                delivered_within_s=self.queue.stuck_after_s
            )
        )
        for run_id, run in store.get_each(store.active()):
            if run is None:
                store.redis.srem(keys.ACTIVE, run_id)
                continue
            repair = self._repair(run, now, held)
            if repair is not None:
                repairs.append(repair)
        if repairs:
            logger.warning("reconciler put %d stuck stages back on their queues", len(repairs))
        return repairs

    def _repair(self, run: RunRecord, now: float, held: Callable[[], set[str]]) -> Repair | None:
        if run.status.is_terminal:
            self.conductor.store.retire(run)
            return None
        stage = run.current_stage
        if stage is None or stage not in run.stages:
            return None
        record = run.stages[stage]
        if not self._stuck(run, stage, now, held):
            return None
        was = record.status.value

        def mutate(current: RunRecord, pipe: Any) -> bool:
            again = current.stages[stage]
            if current.status.is_terminal or not self._stuck(current, stage, now, held):
                return False
            if again.status == StageStatus.RUNNING:
                again.interrupted += 1
            again.status, again.queued_at = StageStatus.QUEUED, now
            again.owner, again.lease_until, again.waiting_until = None, None, None
            return True

        if not self.conductor.store.transact(run.id, mutate):
            return None
        spec = load_pipeline(run.pipeline).stage(stage)
        self.conductor.dispatcher.send_stage(run.id, spec, record.iteration)
        logger.warning("run %s: stage %s was stuck %s; sent again", run.id, stage, was)
        return Repair(run.id, stage, was)

    def _stuck(self, run: RunRecord, stage: str, now: float, held: Callable[[], set[str]]) -> bool:
        record = run.stages[stage]
        late = self.queue.stuck_after_s
        if record.status == StageStatus.RUNNING:
            return record.lease_until is not None and record.lease_until < now
        if record.status == StageStatus.WAITING:
            return record.waiting_until is not None and record.waiting_until + late < now
        if record.status == StageStatus.QUEUED:
            queued_long_ago = record.queued_at is not None and record.queued_at + late < now
            task_id = stage_task_id(run.id, stage, record.iteration)
            return queued_long_ago and task_id not in held()
        return False

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

A run past its budget's wall time (`orchestrator.core.runbudget`) is failed with that reason,
whatever its stages are doing: its spend is marked exceeded, so that no execution of it makes
another model call, and a running execution stops at its next safe point (its run has ended).

A run awaiting approval has nothing to send. A gate whose timeout fell is acted on (the run
fails, or the gate is escalated; a branch's gate fails its branch), whether the run awaits it or
the gate's siblings still run, `orchestrator.core.gates`.

A queued stage whose message waits in another queue than its pipeline names (a queue renamed
since it was sent) is sent again too. A run the reconciler cannot handle never stops the pass:
a run whose pinned pipeline cannot be loaded is failed with that reason, and any other error
(a record that cannot be read, say) is logged and counted, and the pass goes on to the next.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core import fanout, gates, keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import PipelineError
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.pipeline import StageSpec
from orchestrator.core.queue import stage_task_id
from orchestrator.core.runbudget import wall_time_exceeded
from orchestrator.core.settings import QueueConfig
from orchestrator.core.spend import STOPPED, SpendLedger

logger = logging.getLogger(__name__)

Held = Callable[[], dict[str, str]]
"""The tasks the broker holds, by id, each with its queue (read at most once per sweep)."""


@dataclass(frozen=True)
class Repair:
    """One stage the reconciler put back on its queue."""

    run_id: str
    stage: str
    was: str
    """The state it was stuck in."""


@dataclass
class Sweep:
    """What one pass over the active runs did."""

    repairs: list[Repair] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    """Runs failed because no worker can run them (their pinned pipeline cannot be loaded) or
    because they are past their budget's wall time, by id, with the reason."""
    gates: dict[str, str] = field(default_factory=dict)
    """Gates whose timeout fell, as `<run>/<gate>`, with what was done (`expired`,
    `escalated`)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Runs the pass could not handle (logged; it went on), by id, with the error."""


class Reconciler:
    """Sweeps the active runs for stages stuck in a non-terminal state."""

    def __init__(self, conductor: Conductor, queue: QueueConfig) -> None:
        self.conductor = conductor
        self.queue = queue

    def sweep_if_due(self, *, holder: str) -> Sweep | None:
        """Sweep unless another process swept within `reconcile_every_s` (a Redis lock)."""
        ttl_ms = int(self.queue.reconcile_every_s * 1000 * 0.9)
        if not self.conductor.store.redis.set(keys.RECONCILER_LOCK, holder, nx=True, px=ttl_ms):
            return None
        return self.sweep()

    def sweep(self, now: float | None = None) -> Sweep:
        now = time.time() if now is None else now
        sweep = Sweep()
        store = self.conductor.store
        # What the broker holds, read once per sweep and only if a stage has been queued long.
        held: Held = functools.cache(
            lambda: self.conductor.dispatcher.held_task_ids(
                delivered_within_s=self.queue.stuck_after_s
            )
        )

        def broken(run_id: str, exc: Exception) -> None:
            sweep.errors[run_id] = f"{type(exc).__name__}: {exc}"
            logger.error("run %s: its record cannot be read: %s", run_id, exc)

        for run_id, run in store.get_each(store.active(), on_broken=broken):
            if run is None:
                store.redis.srem(keys.ACTIVE, run_id)
            else:
                self._reconcile(run, now, held, sweep)
        if sweep.repairs:
            logger.warning(
                "reconciler put %d stuck stages back on their queues", len(sweep.repairs)
            )
        if sweep.errors:
            logger.error("reconciler could not handle %d runs", len(sweep.errors))
        return sweep

    def _reconcile(self, run: RunRecord, now: float, held: Held, sweep: Sweep) -> None:
        """One active run's part of a sweep: stopped past its wall time, its gates timed out,
        or its stuck stage repaired; an error is counted, never raised."""
        if (overdue := wall_time_exceeded(run, now)) is not None:
            self._stop(run, overdue, sweep)
            return
        try:
            # A branch's gate may time out while its siblings run; a run that changed is
            # looked at again by the next sweep.
            if self._time_out(run, now, sweep) or run.status == RunStatus.AWAITING_APPROVAL:
                return
            repair = self._repair(run, now, held)
        except PipelineError as exc:
            self._fail(run, str(exc), sweep)
            return
        except Exception as exc:
            sweep.errors[run.id] = f"{type(exc).__name__}: {exc}"
            logger.exception("run %s: reconciling it failed; going on with the others", run.id)
            return
        if repair is not None:
            sweep.repairs.append(repair)

    def _fail(self, run: RunRecord, reason: str, sweep: Sweep) -> None:
        """End a run no worker can run, saying why (and, if even that fails, count it)."""
        stage = run.current_stage or "-"
        try:
            self.conductor.fail(run.id, stage, f"cannot be run: {reason}")
        except Exception as exc:
            sweep.errors[run.id] = f"{type(exc).__name__}: {exc}"
            logger.exception("run %s: failing it failed; going on with the others", run.id)
            return
        sweep.failed[run.id] = reason
        logger.error("run %s failed: %s", run.id, reason)

    def _stop(self, run: RunRecord, reason: str, sweep: Sweep) -> None:
        """End a run past its wall time: no more model calls, the run failed with the reason."""
        try:
            SpendLedger(self.conductor.store.redis).stop(run.id, reason)
            self.conductor.fail(run.id, run.current_stage or "-", f"{STOPPED}{reason}")
        except Exception as exc:
            sweep.errors[run.id] = f"{type(exc).__name__}: {exc}"
            logger.exception("run %s: stopping it failed; going on with the others", run.id)
            return
        sweep.failed[run.id] = reason
        logger.warning("run %s stopped by its budget: %s", run.id, reason)

    def _time_out(self, run: RunRecord, now: float, sweep: Sweep) -> bool:
        """Act on the run's gates whose timeout fell, if any; whether it did."""
        if not gates.overdue(run, now):
            return False
        acted = self.conductor.time_out_gates(run.id, now)
        for gate, what in acted.items():
            sweep.gates[f"{run.id}/{gate}"] = what
            logger.warning("run %s: gate %s had no decision in time: %s", run.id, gate, what)
        return bool(acted)

    def _repair(self, run: RunRecord, now: float, held: Held) -> Repair | None:
        if run.status.is_terminal:
            self.conductor.store.retire(run)
            return None
        stage = run.current_stage
        if stage is None or stage not in run.stages:
            return None
        spec = self.conductor.stage_of(run, stage)
        queue = spec.queue
        record = run.stages[stage]
        if record.fan_in is not None:
            return self._repair_branches(run, spec, now, held)
        if not self._stuck(run, stage, queue, now, held):
            return None
        was = record.status.value

        def mutate(current: RunRecord, pipe: Any) -> bool:
            again = current.stages[stage]
            if current.status.is_terminal or not self._stuck(current, stage, queue, now, held):
                return False
            if again.status == StageStatus.RUNNING:
                again.interrupted += 1
            again.status, again.queued_at = StageStatus.QUEUED, now
            again.owner, again.lease_until, again.waiting_until = None, None, None
            return True

        if not self.conductor.store.transact(run.id, mutate):
            return None
        self.conductor.dispatcher.send_stage(run.id, run.pipeline, spec, record.iteration)
        logger.warning("run %s: stage %s was stuck %s; sent again", run.id, stage, was)
        return Repair(run.id, stage, was)

    def _repair_branches(
        self, run: RunRecord, spec: StageSpec, now: float, held: Held
    ) -> Repair | None:
        """A fan-out stage: send its lost branches again (`fanout.lost_branches`), or a `map`
        stage whose branches were never made (its sender was lost before it read the list)."""
        late_s = self.queue.stuck_after_s
        record = run.stages[spec.name]
        if record.fan_in is not None and not record.fan_in.branches:
            if record.queued_at is None or record.queued_at + late_s >= now:
                return None
            sent = fanout.send_branches(self.conductor, run.id, run.pipeline, spec)
            return Repair(run.id, spec.name, "map not sent") if sent else None
        lost = fanout.lost_branches(run, spec.name, now=now, late_s=late_s, held=held)
        lost = fanout.requeue_lost(self.conductor, run.id, spec.name, lost) if lost else []
        if not lost:
            return None
        fanout.send_branches(self.conductor, run.id, run.pipeline, spec, only=lost)
        logger.warning("run %s: branches %s of %s were lost; sent again", run.id, lost, spec.name)
        return Repair(run.id, spec.name, "branches " + ",".join(lost))

    def _stuck(self, run: RunRecord, stage: str, queue: str, now: float, held: Held) -> bool:
        record = run.stages[stage]
        late = self.queue.stuck_after_s
        if record.status == StageStatus.RUNNING:
            return record.lease_until is not None and record.lease_until < now
        if record.status == StageStatus.WAITING:
            return record.waiting_until is not None and record.waiting_until + late < now
        if record.status == StageStatus.QUEUED:
            queued_long_ago = record.queued_at is not None and record.queued_at + late < now
            task_id = stage_task_id(run.id, stage, record.iteration)
            return queued_long_ago and held().get(task_id) != queue
        return False

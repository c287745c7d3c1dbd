"""What one execution holds — a stage of a run, or one branch of a fan-out stage — and the
run transitions it reports through: claimed, renewed, checked before a side effect, recorded,
failed, postponed, stopped.

The stage task (`workers.tasks`), the execution (`workers.execution`) and the heartbeat
(`workers.heartbeat`) speak to a `Holding` and never ask which kind it is: a stage's are the
conductor's transitions (`Conductor.begin`, `renew`, ...), a branch's the fan-out's
(`orchestrator.core.fanout`), which end the branch rather than the stage and leave the join to
the last one (docs/architecture.md, "Fan-out and fan-in").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from orchestrator.core import fanout, fanstop
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import (
    Completion,
    Held,
    Hold,
    StageFigures,
    StageResult,
    StageStart,
)
from orchestrator.core.fanin import BranchRecord
from orchestrator.core.models import RunRecord, StageRecord

logger = logging.getLogger(__name__)


class Holding(Protocol):
    """An execution's side of its run: what it holds (`held`), as `owner`."""

    @property
    def held(self) -> Held: ...

    @property
    def owner(self) -> str: ...

    def begin(self, *, lease_s: float, max_interrupted: int) -> StageStart:
        """Claim the delivered stage or branch, or say why not."""
        ...

    def renew(self, lease_s: float) -> Hold:
        """Extend the lease, if still held; where the execution stands."""
        ...

    def hold(self) -> Hold:
        """Where the execution stands, read: the check before a side effect."""
        ...

    def complete(self, result: StageResult) -> Completion:
        """Record the output; the run moves on (for a branch: once every branch ended)."""
        ...

    def fail(self, error: str, *, figures: StageFigures | None, fenced: bool = True) -> None:
        """End it failed, with what the execution spent; `fenced`: only if still held (an
        unfenced failure is Baton's own, such as a stage interrupted too often)."""
        ...

    def fail_run(self, error: str, *, figures: StageFigures | None) -> None:
        """End the whole run failed (a refusal of the run's budget is the run's, whichever
        execution met it): for a branch, its siblings too, in one transaction."""
        ...

    def postpone(
        self, *, delay_s: float, reason: str, rate_limited: bool, figures: StageFigures
    ) -> bool:
        """Back on its queue after `delay_s`; False if it must not be retried."""
        ...

    def stopped(self, figures: StageFigures) -> None:
        """Record it stopped because the run was cancelled."""
        ...

    def redelivered(self) -> None:
        """A delivery of what is recorded already: do what the recording would have."""
        ...

    def retries(self, run: RunRecord) -> StageRecord | BranchRecord:
        """The record whose retry counts a retry reads (the stage's, or the branch's)."""
        ...


def holding(conductor: Conductor, held: Held, owner: str) -> Holding:
    """The `Holding` of an execution of `held` by `owner`."""
    if held.branch is None:
        return StageHolding(conductor, held, owner)
    return BranchHolding(conductor, held, owner)


@dataclass(frozen=True)
class StageHolding:
    """A stage that does not fan out: the conductor's transitions."""

    conductor: Conductor
    held: Held
    owner: str

    def begin(self, *, lease_s: float, max_interrupted: int) -> StageStart:
        return self.conductor.begin(self.held.run_id, self.held.stage, owner=self.owner,
                                    lease_s=lease_s, max_interrupted=max_interrupted)  # fmt: skip

    def renew(self, lease_s: float) -> Hold:
        return self.conductor.renew(
            self.held.run_id, self.held.stage, owner=self.owner, lease_s=lease_s
        )

    def hold(self) -> Hold:
        return self.conductor.hold(self.held.run_id, self.held.stage, owner=self.owner)

    def complete(self, result: StageResult) -> Completion:
        return self.conductor.complete(self.held.run_id, self.held.stage, result, owner=self.owner)

    def fail(self, error: str, *, figures: StageFigures | None, fenced: bool = True) -> None:
        self.conductor.fail(self.held.run_id, self.held.stage, error,
                            owner=self.owner if fenced else None, figures=figures)  # fmt: skip

    def fail_run(self, error: str, *, figures: StageFigures | None) -> None:
        self.fail(error, figures=figures)  # a stage's failure ends its run

    def postpone(
        self, *, delay_s: float, reason: str, rate_limited: bool, figures: StageFigures
    ) -> bool:
        record = self.conductor.postpone(
            self.held.run_id, self.held.stage, delay_s=delay_s, reason=reason,
            rate_limited=rate_limited, owner=self.owner, figures=figures,
        )  # fmt: skip
        return record is not None

    def stopped(self, figures: StageFigures) -> None:
        self.conductor.stopped(self.held.run_id, self.held.stage, owner=self.owner,
                               figures=figures)  # fmt: skip

    def redelivered(self) -> None:
        logger.info("stage %s of run %s already recorded; only advancing", self.held.stage,
                    self.held.run_id)  # fmt: skip
        self.conductor.advance(self.held.run_id, self.held.stage)

    def retries(self, run: RunRecord) -> StageRecord:
        return run.stages[self.held.stage]


@dataclass(frozen=True)
class BranchHolding:
    """One branch of a fan-out stage: the fan-out's transitions (`orchestrator.core.fanout`).
    Its failure ends the branch, not the stage: the join, once every branch ended, selects
    among those that finished and fails the stage only when none did."""

    conductor: Conductor
    held: Held
    owner: str

    @property
    def branch(self) -> str:
        assert self.held.branch is not None
        return self.held.branch

    def begin(self, *, lease_s: float, max_interrupted: int) -> StageStart:
        return fanout.begin_branch(
            self.conductor, self.held.run_id, self.held.stage, self.branch, owner=self.owner,
            lease_s=lease_s, max_interrupted=max_interrupted,
        )  # fmt: skip

    def renew(self, lease_s: float) -> Hold:
        return fanout.renew_branch(self.conductor, self.held.run_id, self.held.stage, self.branch,
                                   owner=self.owner, lease_s=lease_s)  # fmt: skip

    def hold(self) -> Hold:
        return fanout.hold_branch(
            self.conductor, self.held.run_id, self.held.stage, self.branch, owner=self.owner
        )

    def complete(self, result: StageResult) -> Completion:
        return fanout.complete_branch(self.conductor, self.held.run_id, self.held.stage,
                                      self.branch, result, owner=self.owner)  # fmt: skip

    def fail(self, error: str, *, figures: StageFigures | None, fenced: bool = True) -> None:
        fanout.complete_branch(
            self.conductor, self.held.run_id, self.held.stage, self.branch, None,
            owner=self.owner if fenced else None, error=error, figures=figures,
        )  # fmt: skip

    def fail_run(self, error: str, *, figures: StageFigures | None) -> None:
        fanstop.fail_from_branch(self.conductor, self.held.run_id, self.held.stage, self.branch,
                                 error, owner=self.owner, figures=figures)  # fmt: skip

    def postpone(
        self, *, delay_s: float, reason: str, rate_limited: bool, figures: StageFigures
    ) -> bool:
        return fanout.postpone_branch(
            self.conductor, self.held.run_id, self.held.stage, self.branch, delay_s=delay_s,
            reason=reason, owner=self.owner, rate_limited=rate_limited, figures=figures,
        )  # fmt: skip

    def stopped(self, figures: StageFigures) -> None:
        fanout.complete_branch(self.conductor, self.held.run_id, self.held.stage, self.branch,
                               None, owner=self.owner, figures=figures)  # fmt: skip

    def redelivered(self) -> None:
        logger.info("branch %s of run %s has ended already; nothing to do", self.held,
                    self.held.run_id)  # fmt: skip

    def retries(self, run: RunRecord) -> BranchRecord:
        fan = run.stages[self.held.stage].fan_in
        assert fan is not None, "a branch runs only in a fan-out stage"
        return fan.branches[self.branch]

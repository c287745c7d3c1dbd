"""A `map` stage: one branch per item of an upstream list, made when the stage is sent, and
its gathered output once every branch has ended.

The transaction that queues a `map` stage (`transitions.decide`) is pure and reads no other
output, so it leaves the stage's fan-in without branches (`fanin.open_fan`); sending the stage
(`fanout.send_branches`) first reads the list, which was recorded before, and makes the
branches in the run's transaction (`open_map`), once: a second sender — a redelivery, the
reconciler — finds them made. A list that is missing, empty or longer than `MAX_BRANCHES`
fails the stage and the run, saying which (docs/pipelines.md, "Parallel branches").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.core import handoffs, transitions
from orchestrator.core.branches import branch_number, map_source, mapped_items
from orchestrator.core.fanin import BranchStatus, FanIn, map_fan
from orchestrator.core.models import RunRecord

if TYPE_CHECKING:
    from orchestrator.core.conductor import Conductor
    from orchestrator.core.pipeline import StageSpec


def open_map(conductor: Conductor, run_id: str, spec: StageSpec) -> bool:
    """Make a queued `map` stage's branches from its upstream list, in the run's transaction,
    unless made already; True when it has branches to send. A list it cannot fan out over
    fails the stage and the run with the reason."""
    key, _ = map_source(spec)
    upstream = conductor.store.output(run_id, key)  # recorded before the stage was queued

    def mutate(run: RunRecord, pipe: Any) -> tuple[bool, transitions.Next | None, RunRecord]:
        record = run.stages.get(spec.name)
        fan = record.fan_in if record is not None else None
        if record is None or fan is None or run.status.is_terminal:
            return False, None, run
        if fan.branches:
            return True, None, run
        try:
            items = mapped_items(spec, upstream)
        except ValueError as exc:
            error: str | None = f"cannot fan out: {exc}"
        else:
            error = handoffs.mapped(conductor.store.redis, run, pipe, spec.name, len(items))
        if error is not None:  # no list to fan out over, or the run's budget refuses it
            conductor.audit(run, spec.name, 0, "stage_failed", pipe=pipe, error=error)
            return False, transitions.fail(run, spec.name, error), run
        record.fan_in = map_fan(fan, items)
        conductor.audit(run, spec.name, 0, "map_opened", pipe=pipe, source=spec.map,
                        items=len(items))  # fmt: skip
        return True, None, run

    opened, decision, run = conductor.store.transact(run_id, mutate)
    if decision is not None:
        conductor.carry_out(run, decision)
    return bool(opened)


def gathers(spec: StageSpec) -> bool:
    """Whether the stage's join gathers every branch's output (a `map` stage without a
    `select`) rather than selects one."""
    return spec.map is not None and spec.select is None


def gather(fan: FanIn, stored: Callable[[str], str]) -> tuple[str | None, str | None]:
    """A gathering stage's output once every branch ended: `{"items": [...]}`, the branches'
    outputs in item order (`stored` reads one branch's); or, when a branch failed, no output and
    why: every item is the stage's work, so a missing one fails it."""
    failed = [name for name, branch in fan.branches.items() if branch.status != BranchStatus.DONE]
    if failed:
        reasons = "; ".join(
            f"{name} (item {fan.branches[name].item}): {fan.branches[name].error or 'no output'}"
            for name in sorted(failed, key=branch_number)
        )
        return None, f"{len(failed)} of {len(fan.branches)} items failed: {reasons}"
    ordered = sorted(fan.branches, key=lambda name: fan.branches[name].item or 0)
    items = [json.loads(stored(name)) for name in ordered]
    return transitions.compact({"items": items}), None

"""A judge chooses a fan-out stage's result (`select = { judge = "pick", field = "keep" }`).

At the join of a judged stage (`orchestrator.core.fanout`), nothing is selected: the stage's
output is its candidates, the outputs of the branches that ended done by branch id
(`{"b1": {...}, "b3": {...}}`), and the judge, the stage right after, is queued and reads them as
`{<output key>}`, their compact outputs and nothing else of the branches. When the judge's own
output is recorded, in the same transaction, its field names the branch kept: that branch's
output replaces the candidates under the stage's output key (so every later stage reads the
chosen output, as after a selection by facts), the candidates stay as `<output key>.candidates`,
and the stage's artifacts become the branch's (a later stage applies the chosen diff). A judge
that names no branch that ended done fails, naming what it could have chosen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.core import keys
from orchestrator.core.branches import branch_number, branch_output_key
from orchestrator.core.fanin import BranchStatus, FanIn, choose
from orchestrator.core.models import ArtifactRef, RunRecord

if TYPE_CHECKING:
    from orchestrator.core.pipeline import Pipeline, StageSpec
    from orchestrator.core.store import RunStore

CANDIDATES = "candidates"
"""The suffix the candidates are kept under once the judge chose: `<output key>.candidates`."""


def judged(pipeline: Pipeline, judge: str) -> StageSpec | None:
    """The fan-out stage whose result the stage `judge` chooses, if it is a judge."""
    before = pipeline.before(judge)
    stage = before[0] if before else None
    if stage is None or stage.select is None or stage.select.judge != judge:
        return None
    return stage


def candidates(
    store: RunStore, run_id: str, spec: StageSpec, fan: FanIn, unwritten: Mapping[str, str]
) -> dict[str, Any]:
    """The outputs of the branches that ended done, by branch id, in branch order;
    `unwritten`: those the calling transaction writes itself (not in Redis yet), by branch."""
    done = sorted(
        (name for name, record in fan.branches.items() if record.status == BranchStatus.DONE),
        key=branch_number,
    )
    if not done:
        return {}
    stored = store.redis.hmget(
        keys.outputs(run_id), [branch_output_key(spec.output_key, name) for name in done]
    )
    found = {name: unwritten.get(name, raw) for name, raw in zip(done, stored, strict=True)}
    return {name: json.loads(raw) for name, raw in found.items() if raw}


def apply(
    store: RunStore, run: RunRecord, pipe: Any, stage: StageSpec, verdict: Mapping[str, Any]
) -> str:
    """Within the transaction that records the judge's output: make the branch it names the
    output of the fan-out `stage`. Returns the branch.

    Raises:
        ValueError: the judge named no branch that ended done (the message says which it could).
    """
    assert stage.select is not None and stage.select.judge is not None
    record = run.stages[stage.name]
    fan = record.fan_in
    if fan is None:
        raise ValueError(f"stage {stage.name!r} ran no branches to judge")
    named = verdict.get(stage.select.field)
    chosen = choose(fan, named if isinstance(named, str) else repr(named))
    outputs = keys.outputs(run.id)
    raw = store.redis.hget(outputs, branch_output_key(stage.output_key, chosen))
    current = store.redis.hget(outputs, stage.output_key)
    assert raw is not None, f"branch {chosen} ended done without an output"
    if current is not None:
        pipe.hset(outputs, f"{stage.output_key}.{CANDIDATES}", current)
    pipe.hset(outputs, stage.output_key, raw)
    artifacts = fan.branches[chosen].artifacts
    record.artifacts = {name: ArtifactRef.model_validate(ref) for name, ref in artifacts.items()}
    return chosen

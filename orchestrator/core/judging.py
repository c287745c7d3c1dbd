"""A fan-out stage whose `select` names a judge: the stage right after it reads the branches'
compact outputs, by branch id, and names the one to keep.

At the join (`fanout.complete_branch`) the fan-out stage's output is its candidates,
`{"b1": {...}, "b3": {...}}`: the outputs of the branches that finished, nothing else of them
(`candidates`). The judge is an ordinary stage that reads it as `{<output key>}`. The
transaction that records the judge's output applies its choice (`apply`): the chosen branch's
output and artifacts become the fan-out stage's, so every stage after the judge reads the chosen
output and applies the chosen change (the candidates stay, as `<output key>.candidates`); a
choice of no branch that finished fails the run, naming what the judge could have chosen
(docs/architecture.md, "Fan-out and fan-in").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.core import keys, transitions
from orchestrator.core.branches import branch_number, branch_output_key
from orchestrator.core.fanin import BranchStatus, FanIn, choose
from orchestrator.core.models import ArtifactRef, RunRecord

CANDIDATES = "candidates"
"""Once the judge chose, what it chose among stays under `<output key>.candidates`."""

if TYPE_CHECKING:
    from orchestrator.core.pipeline import Pipeline, StageSpec
    from orchestrator.core.store import RunStore


def judged(spec: StageSpec) -> bool:
    """Whether a judge stage chooses this fan-out stage's output."""
    return spec.select is not None and spec.select.judge is not None


def candidates(fan: FanIn, stored: Callable[[str], str]) -> str | None:
    """A judged stage's output at its join: each finished branch's output by its id, in branch
    order (`stored` reads one); None when no branch finished."""
    done = sorted(
        (name for name, branch in fan.branches.items() if branch.status == BranchStatus.DONE),
        key=branch_number,
    )
    if not done:
        return None
    return transitions.compact({name: json.loads(stored(name)) for name in done})


def apply(
    store: RunStore, run: RunRecord, pipe: Any, pipeline: Pipeline, judge: str,
    output: dict[str, Any],
) -> str | None:  # fmt: skip
    """Within the transaction that records `judge`'s `output`: if it judges the stage before
    it, make the branch it names that stage's output and artifacts. Returns why the choice
    cannot be applied (the judge named no branch that finished), else None.
    """
    before = pipeline.before(judge)
    spec = before[0] if before else None
    if spec is None or spec.select is None or spec.select.judge != judge:
        return None
    record = run.stages[spec.name]
    fan = record.fan_in
    assert fan is not None, "a judged stage ran as branches"
    try:
        branch = choose(fan, str(output.get(spec.select.field)))
    except ValueError as exc:
        return str(exc)
    outputs = keys.outputs(run.id)
    chosen = store.redis.hget(outputs, branch_output_key(spec.output_key, branch))
    assert chosen is not None, f"branch {branch} ended done without an output"
    if (offered := store.redis.hget(outputs, spec.output_key)) is not None:
        # What the judge read, kept once: a judge that runs again reads it again (`offer_again`).
        pipe.hsetnx(outputs, f"{spec.output_key}.{CANDIDATES}", offered)
    pipe.hset(outputs, spec.output_key, chosen)
    artifacts = fan.branches[branch].artifacts
    record.artifacts = {name: ArtifactRef.model_validate(ref) for name, ref in artifacts.items()}
    return None


def offer_again(store: RunStore, run_id: str, pipeline: Pipeline, target: str) -> None:
    """A run resumed at a judge (its judged stage kept): the judged stage's output is its
    candidates again, which the judge reads, and not the choice it made before."""
    before = pipeline.before(target)
    spec = before[0] if before else None
    if spec is None or spec.select is None or spec.select.judge != target:
        return
    outputs = keys.outputs(run_id)
    if (offered := store.redis.hget(outputs, f"{spec.output_key}.{CANDIDATES}")) is not None:
        store.redis.hset(outputs, spec.output_key, offered)

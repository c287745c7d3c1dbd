"""Fan-out in a pipeline's spec: a stage that runs as several branches (`parallel = 3`, or
`map = "<upstream output key>.<field>"` for one branch per item of an upstream list), how its
result is selected (`select`), and the names a branch goes by.

Every branch is named `b1` … `bN`; its session id, branch label, Celery task id and task name
are made here and only here (docs/architecture.md, "Fan-out and fan-in"). The fan-in
bookkeeping is `orchestrator.core.fanin`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core.rules import NAME, split_source

if TYPE_CHECKING:
    from orchestrator.core.pipeline import StageSpec

MIN_PARALLEL = 2
"""`parallel = 1` is a stage that does not fan out: refused, so a spec never says it does."""
MAX_BRANCHES = 10
"""The most branches one stage may run: `parallel` at most, and the longest list a `map`
stage fans out over (a longer one fails the stage, saying so)."""
ITEM_KEY = "item"
"""State key a `map` stage's branch reads its item by (`{item}`)."""
BRANCH_KEY = "branch"
"""State key a fan-out stage's branch reads its own id by (`{branch}`: `b1` … `bN`), to vary
what each branch tries."""
PUBLISH_TOOL = "publish"
"""The built-in tool (`BUILTIN_TOOLS`) that pushes a change out: no fan-out stage may have
it."""
BY_PROOF = "proof"
"""`select = "proof"`: by the measured facts (proof passed, then the smallest diff)."""


class SelectRule(BaseModel):
    """Which branch's output becomes the stage's: by measured facts (`select = "proof"`), or as
    the judge stage right after names it (`select = { judge = "pick", field = "<field>" }`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: str | None = Field(None, pattern=f"^{NAME}$")
    """The stage right after, which sees the branches' compact outputs and names one; None:
    select by facts."""
    field: str = Field("", pattern=f"^({NAME})?$")
    """The judge's output field (a string) that holds the id of the branch it keeps; named by
    the spec, as every field a rule reads is."""

    @model_validator(mode="before")
    @classmethod
    def _spelled(cls, value: Any) -> Any:
        if value == BY_PROOF:
            return {}
        if isinstance(value, str):
            raise ValueError(f'select is "{BY_PROOF}" or {{ judge = "<stage>" }}, not {value!r}')
        if isinstance(value, dict) and not {"judge", "field"} <= value.keys():
            raise ValueError(
                "a select table names its judge and the judge's output field that holds the "
                'branch it keeps: select = { judge = "<stage>", field = "<field>" }'
            )
        return value

    @property
    def by_facts(self) -> bool:
        return self.judge is None


def check_spec(stage: StageSpec) -> None:
    """What a stage's fan-out fields say on their own holds together.

    Raises:
        ValueError: names the stage and the field.
    """
    fans_out = stage.parallel is not None or stage.map is not None
    if stage.parallel is not None and stage.map is not None:
        raise ValueError(f"stage {stage.name!r} has both `parallel` and `map`; give one")
    if stage.parallel is not None and not MIN_PARALLEL <= stage.parallel <= MAX_BRANCHES:
        raise ValueError(
            f"stage {stage.name!r}: parallel is {stage.parallel}; it must be from {MIN_PARALLEL} "
            f"to {MAX_BRANCHES}"
        )
    if stage.select is not None and not fans_out:
        raise ValueError(
            f"stage {stage.name!r} has `select` but does not fan out (`parallel` or `map`)"
        )
    if stage.parallel is not None and stage.select is None:
        raise ValueError(
            f"stage {stage.name!r} runs {stage.parallel} branches in parallel and needs a "
            f'`select`: "{BY_PROOF}" or {{ judge = "<stage>" }}'
        )
    if fans_out and stage.loop is not None:
        raise ValueError(f"stage {stage.name!r} fans out and loops; a fan-out stage has no `loop`")
    if fans_out and PUBLISH_TOOL in stage.tools:
        raise ValueError(
            f"stage {stage.name!r} fans out and has the `{PUBLISH_TOOL}` tool: every branch would "
            "publish; publish from the stage after it, which gets the selected branch's change"
        )
    if stage.select is not None and stage.select.by_facts and stage.proof is None:
        raise ValueError(
            f'stage {stage.name!r} selects by "{BY_PROOF}" but has no `proof` rule, which is '
            "what measures the fact it selects on"
        )


def mapped_items(stage: StageSpec, upstream: Mapping[str, Any] | None) -> list[Any]:
    """The items a `map` stage fans out over, read from its upstream output: one branch each.

    Raises:
        ValueError: saying why the stage cannot fan out: the upstream output or its list is
            missing, the list is empty (nothing to map over: the stage fails rather than give
            the next stage an output that says nothing), or it is longer than `MAX_BRANCHES`.
    """
    assert stage.map is not None
    items = (upstream or {}).get(map_source(stage)[1])
    if not isinstance(items, list):
        return _refuse(f"{stage.map} is not a list the run has")
    if not items:
        return _refuse(f"{stage.map} is empty: there is nothing to map over")
    if len(items) > MAX_BRANCHES:
        return _refuse(f"{stage.map} has {len(items)} items; a stage runs at most {MAX_BRANCHES} "
                       "branches")  # fmt: skip
    return items


def _refuse(reason: str) -> list[Any]:
    raise ValueError(reason)


def map_source(stage: StageSpec) -> tuple[str, str]:
    """The upstream output key and the list field a `map` stage fans out over."""
    assert stage.map is not None
    return split_source(stage.map)


def branch_ids(count: int) -> list[str]:
    """`b1` … `b<count>`, in order."""
    return [f"b{number}" for number in range(1, count + 1)]


def branch_number(branch: str) -> int:
    """`b3` → 3."""
    return int(branch.removeprefix("b"))


def branch_session_id(run_id: str, stage: str, branch: str, attempt: int) -> str:
    """`<run>:<stage>:<branch>:<attempt>`: each attempt of each branch its own session."""
    return f"{run_id}:{stage}:{branch}:{attempt}"


def branch_label(pipeline: str, stage: str, branch: str) -> str:
    """`<pipeline>.<stage>.<branch>`, on every audit entry of the branch."""
    return f"{pipeline}.{stage}.{branch}"


def branch_task_id(run_id: str, stage: str, branch: str) -> str:
    """`<run>.<stage>.<branch>`: deterministic, so a redelivery or a re-send keeps it."""
    return f"{run_id}.{stage}.{branch}"


def branch_task_name(pipeline: str, stage: str, branch: str) -> str:
    """What Flower shows for a branch's task: `baton.<pipeline>.<stage>.<branch>`."""
    return f"baton.{pipeline}.{stage}.{branch}"


def branch_output_key(output_key: str, branch: str) -> str:
    """The field of the run's outputs hash a branch's output is stored under until the join:
    `<output key>#<branch>` (no output key holds `#`)."""
    return f"{output_key}#{branch}"

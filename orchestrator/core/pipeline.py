"""Pipelines as data: stages, their queues, instructions, tools, output schemas and budgets.

A pipeline is a TOML file, read, named and pinned by `orchestrator.core.specs`; its identity is
its `name` and the digest of its content (`Pipeline.digest`), which a run pins. Besides its
stages it may declare tools of its own (`[tools.<name>]`, `orchestrator.core.tools`), which a
pipeline's loading checks (`orchestrator.core.toolcheck`). Instructions are templates with
`{key}` placeholders that name the issue (`{issue}`), the change under review (`{change}`) or an
upstream stage's output key; `{key?}` renders as empty when the value is missing and `{{` / `}}`
are literal braces. Baton renders templates itself, in one pass, so braces inside the values
(code, diffs, issue bodies) are never interpreted.

The stage features Baton carries out itself (stop rules, verification, reproduction, proof,
loops, publication, compaction) are rules of `orchestrator.core.rules`: they read the fields of a
stage's output the spec names, never a name of their own, each checked against the output
schema when the pipeline loads (`orchestrator.core.references`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.core import branches, references
from orchestrator.core.autonomy import Autonomy
from orchestrator.core.autonomy import check as check_autonomy
from orchestrator.core.delegation import DELEGATE_TOOL, DelegateRule
from orchestrator.core.errors import PipelineError
from orchestrator.core.facts import Fact, Reproduced, Reproduction, recorded
from orchestrator.core.gates import GateRule
from orchestrator.core.providers import parse_model
from orchestrator.core.rules import (
    NAME,
    SOURCE,
    CompactionRule,
    LoopRule,
    ProofRule,
    PublishRule,
    ReproduceRule,
    SendBackRule,
    StageBudget,
    StopRule,
    VerifyRule,
)
from orchestrator.core.runbudget import RunBudget
from orchestrator.core.tools import ToolDeclaration

ISSUE_KEY = "issue"
"""State key of the issue digest every stage may reference."""
CHANGE_KEY = "change"
"""State key of the change under review: the newest change an earlier stage of the run made and
kept (a fix, which a review stage reads), else the unified diff from the run's base to its
commit (`RunRecord.base`: a pull request's base, or `--base`). A pipeline with a stage that
references it and comes after no stage that keeps a change runs only on a run that has a base;
enqueueing one without is refused."""
PREVIOUS_ATTEMPT_KEY = "previous_attempt"
"""State key a looped stage may reference: Baton's compact summary of its previous iteration
(its diff stat, failing tests and the tail of their output); empty in the first."""

PIPELINE_NAME = r"^[a-z][a-z0-9_-]{0,62}$"
"""A pipeline's name: it names its queues (`baton.<pipeline>.<stage>`), log labels and metrics."""
RESERVED_NAMES = frozenset({"build"})
"""Names no pipeline may take: `baton.build.*` are the environment builders' queues."""
QUEUE_PREFIX = "baton."
"""Every stage queue starts with it: the Redis users' ACLs (k8s/baton/redis-users.acl), the
reconciler and `baton top` know the queues by it."""
_TOKEN = re.compile(r"\{\{|\}\}|\{(" + NAME + r"(?::" + NAME + r")?)(\?)?\}")


class StageSpec(BaseModel):
    """One stage: what it is told, what it may use, what it must return."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=f"^{NAME}$")
    model: str | None = None
    """The model this stage runs on (`orchestrator.core.providers`): `gemini-…` through
    google-genai, or a LiteLLM id such as `openai/gpt-4.1-mini`; unset, the pipeline's `model`,
    else `BATON_MODEL`."""
    instruction: str
    output_schema: str
    """Import path `module:Class` of the pydantic model the output must validate against."""
    queue: str = Field("", pattern=r"^(baton\.[A-Za-z0-9_.-]+)?$")
    """Celery queue; defaults to `baton.<pipeline>.<stage>` (`stage_queue`), so that no two
    pipelines share one. Any other must start with `baton.`."""
    output_key: str = ""
    """State key the output is stored under; defaults to the stage name. A `temp:` key is
    removed when the run ends."""
    tools: tuple[str, ...] = ()
    """The tools its model may call: built-in ones and the pipeline's declared ones, by name."""
    budget: StageBudget = StageBudget()
    stop_when: StopRule | None = None
    verify: VerifyRule | None = None
    reproduce: ReproduceRule | None = None
    proof: ProofRule | None = None
    loop: LoopRule | None = None
    send_back: SendBackRule | None = None
    """Judge an earlier looped stage's accepted output (a review) and send the run back to it
    when the judgement does not hold (`orchestrator.core.rules.SendBackRule`)."""
    gate: GateRule | None = None
    """Park the run once this stage is done, until a person approves its output (or rejects
    it): `orchestrator.core.gates`."""
    publish: PublishRule = PublishRule()
    """What its `publish` tool may publish (a stage without that tool ignores it)."""
    compaction: CompactionRule | None = None
    """Summarise the older part of a long history rather than only trimming it; off by
    default."""
    parallel: int | None = None
    """Run the stage as this many branches at once, each in a fresh session (best-of-N); its
    `select` picks the one whose output is the stage's (`orchestrator.core.branches`)."""
    map: str | None = Field(None, pattern=SOURCE)
    """`<upstream output key>.<field>`: run one branch per item of that list, each reading its
    item as `{item}`."""
    select: branches.SelectRule | None = None
    """Which branch's output becomes the stage's: `"proof"` or `{ judge = "<stage>" }`."""
    delegate: DelegateRule | None = None
    """How its `delegate` tool starts child agents (`orchestrator.core.delegation`); a stage
    that names the tool without this table gets the defaults."""
    sandbox_network: str | None = Field(None, pattern=r"^\w[\w.-]*$")
    """The Docker network this stage's sandbox joins (an egress proxy's, say); by default it
    has no network at all. Never `host` or another container's."""

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        try:
            return parse_model(value).id
        except ValueError as exc:
            raise ValueError(f"stage {info.data.get('name', '?')!r}: {exc}") from None

    @field_validator("sandbox_network")
    @classmethod
    def _not_a_shared_namespace(cls, value: str | None) -> str | None:
        if value in ("host", "none"):
            raise ValueError(f"sandbox_network may not be {value!r}: name a Docker network")
        return value

    @model_validator(mode="after")
    def _compaction_within_budget(self) -> StageSpec:
        if self.compaction is None:
            return self
        budget = self.budget.max_request_tokens
        trigger = self.compaction.trigger_tokens or budget
        if trigger > budget:
            raise ValueError(
                f"stage {self.name!r}: compaction.trigger_tokens ({trigger}) is above "
                f"budget.max_request_tokens ({budget}), where requests are trimmed first; "
                "lower it or leave it out"
            )
        if self.compaction.max_summary_tokens > trigger // 2:
            raise ValueError(
                f"stage {self.name!r}: compaction.max_summary_tokens "
                f"({self.compaction.max_summary_tokens}) is more than half of the {trigger} "
                "tokens that trigger a compaction; a summary must leave room for the "
                "exchanges it keeps"
            )
        return self

    @model_validator(mode="after")
    def _fan_out(self) -> StageSpec:
        branches.check_spec(self)
        return self

    @property
    def keeps_change(self) -> bool:
        """Whether the stage's change of its workspace is kept for the stages after it: it
        verifies or proves it."""
        return self.verify is not None or self.proof is not None

    @property
    def fans_out(self) -> bool:
        """Whether the stage runs as branches (`parallel` or `map`)."""
        return self.parallel is not None or self.map is not None

    @model_validator(mode="after")
    def _delegation(self) -> StageSpec:
        if self.delegate is None and DELEGATE_TOOL in self.tools:
            object.__setattr__(self, "delegate", DelegateRule())
        if self.delegate is not None and (
            problems := self.delegate.problems(self.name, self.tools)
        ):
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _defaults(self) -> StageSpec:
        if not self.output_key:
            object.__setattr__(self, "output_key", self.name)
        return self

    @property
    def inputs(self) -> list[str]:
        """State keys the instruction references, in order of first use."""
        return list(dict.fromkeys(_placeholders(self.instruction)))

    def schema_class(self) -> type[BaseModel]:
        return _import_schema(self.output_schema)

    def reproduction(self, output: Mapping[str, Any]) -> Reproduction:
        """The reproducing test this stage's `output` names, with Baton's run of it if recorded
        (a stage with a `reproduce` rule).

        Raises:
            pydantic.ValidationError: a field the rule names does not hold what it should.
        """
        assert self.reproduce is not None
        measured = recorded(self.schema_class(), output, Fact.REPRODUCED, Reproduced)
        return self.reproduce.read(output, measured)


class Pipeline(BaseModel):
    """An ordered list of stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=PIPELINE_NAME)
    description: str = ""
    tools: dict[str, ToolDeclaration] = Field(default_factory=dict)
    """Tools beyond the built-in ones, by name (`orchestrator.core.tools`); a stage names those it
    may call in its own `tools`."""
    model: str | None = None
    """The model of every stage that names none (`StageSpec.model`); unset, `BATON_MODEL`."""
    stages: tuple[StageSpec, ...]
    run_budget: RunBudget | None = None
    """`[run_budget]`: limits on what a run spends across all its stages
    (`orchestrator.core.runbudget`); `baton enqueue --budget` overrides them per run."""
    autonomy: Autonomy | None = None
    """How far a run goes on its own by a score a stage reports (`orchestrator.core.autonomy`)."""
    _table: dict[str, Any] | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_NAMES:
            raise ValueError(f"{value!r} is reserved: Baton's own queues start baton.{value}.")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        return None if value is None else parse_model(value).id

    def model_of(self, stage: StageSpec, default: str) -> str:
        """The model id `stage` runs on: its own, else the pipeline's, else `default`
        (`BATON_MODEL`)."""
        return stage.model or self.model or default

    @model_validator(mode="after")
    def _check(self) -> Pipeline:
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        for stage in self.stages:
            if not stage.queue:
                object.__setattr__(stage, "queue", stage_queue(self.name, stage.name))
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat: {names}")
        known = {ISSUE_KEY, CHANGE_KEY}
        earlier: dict[str, StageSpec] = {}
        for stage in self.stages:
            _check_inputs(stage, known)
            stage.schema_class()
            references.check_stage(stage, earlier)
            if stage.output_key in known:
                raise ValueError(f"stage {stage.name!r} reuses output key {stage.output_key!r}")
            known.add(stage.output_key)
            earlier[stage.output_key] = stage
        for index, stage in enumerate(self.stages):
            references.check_publishable_by(stage, {s.name: s for s in self.stages[index + 1 :]})
            references.check_send_back(stage, {s.name: s for s in self.stages[:index]})
            if stage.select is not None and stage.select.judge is not None:
                after = self.stages[index + 1] if index + 1 < len(self.stages) else None
                references.check_judge(stage, after)
        if self.autonomy is not None:
            check_autonomy(self.autonomy, self.stages, earlier)
        return self

    @property
    def table(self) -> dict[str, Any]:
        """The spec as written (its TOML table), what a run pins; for a pipeline made from
        Python, as the model dumps it."""
        return self._table if self._table is not None else self.model_dump(mode="json")

    @property
    def content(self) -> str:
        """The pinned form of the spec: its table as canonical JSON."""
        return canonical_json(self.table)

    @property
    def digest(self) -> str:
        """The SHA-256 of `content`: which version of the pipeline a run runs."""
        return spec_digest(self.content)

    @property
    def first(self) -> StageSpec:
        return self.stages[0]

    @property
    def reads_change(self) -> bool:
        """Whether a stage references `{change}` before any stage has made one to read: the
        pipeline reviews a change it is given, so a run of it needs a base."""
        for stage in self.stages:
            if CHANGE_KEY in stage.inputs:
                return True
            if stage.keeps_change:
                return False
        return False

    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise PipelineError(f"pipeline {self.name!r} has no stage {name!r}")

    def next_after(self, name: str) -> StageSpec | None:
        index = self._index(name)
        return self.stages[index + 1] if index + 1 < len(self.stages) else None

    def producing(self, output_key: str) -> StageSpec:
        """The stage whose output is stored under `output_key`."""
        for stage in self.stages:
            if stage.output_key == output_key:
                return stage
        raise PipelineError(f"pipeline {self.name!r} has no stage with output key {output_key!r}")

    def before(self, name: str) -> tuple[StageSpec, ...]:
        """The stages before `name`, the nearest first."""
        return self.stages[: self._index(name)][::-1]

    def _index(self, name: str) -> int:
        return [s.name for s in self.stages].index(self.stage(name).name)


def _check_inputs(stage: StageSpec, known: set[str]) -> None:
    for key in stage.inputs:
        if key == branches.ITEM_KEY and stage.map is None:
            raise ValueError(
                f"stage {stage.name!r} references {{{key}}}, which only a stage with a `map` has"
            )
        if key == branches.BRANCH_KEY and not stage.fans_out:
            raise ValueError(
                f"stage {stage.name!r} references {{{key}}}, which only a stage that fans out "
                "(`parallel` or `map`) has"
            )
        if key in (branches.ITEM_KEY, branches.BRANCH_KEY):
            continue
        if key == PREVIOUS_ATTEMPT_KEY:
            if stage.loop is None:
                raise ValueError(
                    f"stage {stage.name!r} references {{{key}}}, which only a stage with a "
                    "`loop` has"
                )
        elif key not in known:
            raise ValueError(
                f"stage {stage.name!r} references {{{key}}}, which is neither "
                f"{{{ISSUE_KEY}}}, {{{CHANGE_KEY}}} nor an earlier stage's output key (write "
                "{{ for a literal brace)"
            )


def render(template: str, values: Mapping[str, Any]) -> str:
    """Substitute `{key}` placeholders in one pass; values are never re-scanned.

    Raises:
        KeyError: a required placeholder has no value.
    """

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        key, optional = match.group(1), match.group(2)
        if key not in values or values[key] is None:
            if optional:
                return ""
            raise KeyError(key)
        return _as_text(values[key])

    return _TOKEN.sub(replace, template)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=1, ensure_ascii=False)


def placeholders(template: str) -> list[str]:
    """The state keys a template's `{key}` placeholders name, in order, repeats included."""
    return _placeholders(template)


def _placeholders(template: str) -> list[str]:
    return [m.group(1) for m in _TOKEN.finditer(template) if m.group(1)]


RETIRED_SCHEMA_MODULES = ("orchestrator.schemas", "orchestrator.core.schemas")
"""Modules that held output schemas before (issue 23 split `orchestrator/` into `core` and
`control`, then gave the fixer its own package): a spec that still names one is told the new
path of what it names."""
SCHEMA_MODULES = (
    "orchestrator.pipelines.fixer.schemas",
    "orchestrator.pipelines.schemas",
    "orchestrator.core.facts",
)
"""Where the schemas of the retired modules went: the fixer's, the generic `Summary`, and the
engine's facts."""


def import_schema(path: str) -> type[BaseModel]:
    """The output schema `module:Class` names, imported (once per process).

    Raises:
        PipelineError: it cannot be imported or is not a pydantic model; the message says why.
    """
    return _import_schema(path)


@cache
def _import_schema(path: str) -> type[BaseModel]:
    module_name, _, attr = path.partition(":")
    if module_name in RETIRED_SCHEMA_MODULES:
        moved = [
            m
            for m in SCHEMA_MODULES
            if getattr(getattr(importlib.import_module(m), attr, None), "__module__", None) == m
        ]
        where = (
            f"write {moved[0]}:{attr}"
            if moved
            else f"its schemas went to {', '.join(SCHEMA_MODULES)}, and none has {attr!r}"
        )
        raise PipelineError(f"output schema {path!r}: the module {module_name} is gone; {where}")
    try:
        schema = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise PipelineError(f"output schema {path!r} cannot be imported: {exc}") from exc
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise PipelineError(f"output schema {path!r} is not a pydantic model")
    return schema


def stage_queue(pipeline: str, stage: str) -> str:
    """The queue of a stage that names none: `baton.<pipeline>.<stage>`."""
    return f"{QUEUE_PREFIX}{pipeline}.{stage}"


def canonical_json(table: Mapping[str, Any]) -> str:
    """A spec's table as the one JSON text its digest is taken of (sorted keys, no spaces).

    Raises:
        PipelineError: the table holds a value JSON cannot (a TOML date or time).
    """
    try:
        return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except TypeError as exc:
        raise PipelineError(f"a pipeline spec holds a value it cannot carry: {exc}") from exc


def spec_digest(content: str) -> str:
    """The SHA-256 (hex) of a spec's canonical JSON."""
    return hashlib.sha256(content.encode()).hexdigest()


def load_pipeline(name_or_path: str) -> Pipeline:
    """A pipeline by file path or installed name, read now (`orchestrator.core.specs`, where
    pipelines are read, named and pinned; here for the many callers that load one by name)."""
    from orchestrator.core.specs import load_pipeline as load

    return load(name_or_path)

"""The fields a pipeline spec's stage features read, checked against the output schemas when the
pipeline loads.

Stop rules, verification, reproduction, proof, loops and publication read fields of a stage's
output by the names the spec gives them (`orchestrator.core.pipeline`): a name its schema lacks
would otherwise only show when the stage's run reaches it, after earlier stages spent model
calls — or never, as a rule that silently never holds. Each check here raises a `ValueError`
naming the stage, the rule, the field and the schema; `load_pipeline` adds the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

from pydantic import BaseModel

from orchestrator.core.facts import Fact, measured_fields
from orchestrator.core.rules import split_source

if TYPE_CHECKING:
    from orchestrator.core.pipeline import StageSpec


class Kind(Enum):
    """What a field a rule reads must hold."""

    ANY = "anything"
    TEXT = "a string"
    TEXTS = "a list of strings"
    LIST = "a list"
    FLAG = "a boolean"


def check_stage(stage: StageSpec, earlier: Mapping[str, StageSpec]) -> None:
    """Every field `stage`'s rules read exists, with a type that fits, in the schema whose
    output holds it; `earlier`: the stages before it by output key.

    Raises:
        ValueError: names the stage, the rule and the field.
    """
    schema = stage.schema_class()
    if stage.stop_when is not None:
        _field(stage, schema, "stop_when.field", stage.stop_when.field, Kind.ANY)
        if stage.stop_when.reason_field is not None:
            _field(stage, schema, "stop_when.reason_field", stage.stop_when.reason_field, Kind.ANY)
    if stage.verify is not None:
        key, name = stage.verify.source
        upstream = _upstream(stage, earlier, key, "verify.command_from")
        _field(stage, upstream, "verify.command_from", name, Kind.TEXT, stage.verify.command_from)
    for (key, name), written in zip(stage.publish.sources, stage.publish.planned_from, strict=True):
        upstream = _upstream(stage, earlier, key, "publish.planned_from")
        _field(stage, upstream, "publish.planned_from", name, Kind.TEXTS, written)
    if stage.map is not None:
        key, name = split_source(stage.map)
        upstream = _upstream(stage, earlier, key, "map")
        _field(stage, upstream, "map", name, Kind.LIST, stage.map)
    _check_reproduce(stage, schema)
    _check_proof(stage, schema, earlier)
    if stage.loop is not None:
        kinds = {"until": Kind.FLAG, "reason_from": Kind.ANY, "summary_from": Kind.ANY}
        for rule, kind in kinds.items():
            path = getattr(stage.loop, rule)
            if path is not None:
                _field(stage, schema, f"loop.{rule}", path, kind)


def check_judge(stage: StageSpec, after: StageSpec | None) -> None:
    """The judge a fan-out stage's `select` names is the stage right after it, and its output
    schema has the string field that names the branch it keeps.

    Raises:
        ValueError: names the stage, the judge and the field.
    """
    assert stage.select is not None and stage.select.judge is not None
    judge = stage.select.judge
    if after is None or after.name != judge:
        following = f"the stage after it is {after.name!r}" if after else "it is the last stage"
        raise ValueError(
            f"stage {stage.name!r}: select.judge names {judge!r}, which must be the stage right "
            f"after it; {following}"
        )
    rule = f"select.field of stage {stage.name!r}"
    _field(after, after.schema_class(), rule, stage.select.field, Kind.TEXT)


def _check_reproduce(stage: StageSpec, schema: type[BaseModel]) -> None:
    rule = stage.reproduce
    if rule is None:
        return
    if not stage.tools:
        raise ValueError(f"stage {stage.name!r} reproduces, so it needs code tools")
    _field(stage, schema, "reproduce.command_from", rule.command_from, Kind.TEXT)
    _field(stage, schema, "reproduce.test_files_from", rule.test_files_from, Kind.TEXTS)
    _field(stage, schema, "reproduce.expected_failure_from", rule.expected_failure_from, Kind.TEXT)
    _measures(stage, schema, Fact.REPRODUCED, "reproduces")


def _check_proof(
    stage: StageSpec, schema: type[BaseModel], earlier: Mapping[str, StageSpec]
) -> None:
    if stage.proof is None:
        return
    source = stage.proof.reproduction_from
    reproducer = earlier.get(source)
    if reproducer is None or reproducer.reproduce is None:
        raise ValueError(
            f"stage {stage.name!r} proves with {source!r}, which names no earlier stage with a "
            "`reproduce` rule"
        )
    _measures(stage, schema, Fact.PROOF, "has a proof")


def check_publishable_by(stage: StageSpec, later: Mapping[str, StageSpec]) -> None:
    """A proof's `publishable_by` names a later stage (by name) that publishes."""
    name = stage.proof.publishable_by if stage.proof is not None else None
    if name is None:
        return
    publisher = later.get(name)
    if publisher is None or "publish" not in publisher.tools:
        raise ValueError(
            f"stage {stage.name!r} proves its change publishable by {name!r}, which names no "
            "later stage with the `publish` tool"
        )


def check_send_back(stage: StageSpec, earlier: Mapping[str, StageSpec]) -> None:
    """A `send_back` rule names an earlier looped stage (by name) that runs as one, and reads
    flags of its own stage's output.

    Raises:
        ValueError: names the stage, the rule and what is wrong.
    """
    rule = stage.send_back
    if rule is None:
        return
    target = earlier.get(rule.to)
    if target is None or target.loop is None:
        raise ValueError(
            f"stage {stage.name!r}: send_back.to names {rule.to!r}, which names no earlier stage "
            "with a `loop`"
        )
    if target.fans_out or stage.fans_out:
        raise ValueError(
            f"stage {stage.name!r}: send_back cannot send a run back to a stage that fans out, "
            "nor be the rule of one"
        )
    schema = stage.schema_class()
    for path in rule.unless:
        _field(stage, schema, "send_back.unless", path, Kind.FLAG)
    if rule.reason_from is not None:
        _field(stage, schema, "send_back.reason_from", rule.reason_from, Kind.ANY)
    if rule.then == "gate" and stage.gate is not None:
        raise ValueError(
            f"stage {stage.name!r} has a `gate` and a send_back whose refusal opens one: keep one"
        )


def _measures(stage: StageSpec, schema: type[BaseModel], fact: Fact, does: str) -> None:
    if fact not in measured_fields(schema):
        raise ValueError(
            f"stage {stage.name!r} {does}, but its output schema {stage.output_schema!r} has no "
            f"field for what Baton measures (`Measured(Fact.{fact.name})`)"
        )


def _upstream(
    stage: StageSpec, earlier: Mapping[str, StageSpec], key: str, rule: str
) -> type[BaseModel]:
    if key not in earlier:
        raise ValueError(
            f"stage {stage.name!r}: {rule} names {key!r}, which is no earlier stage's output key"
        )
    return earlier[key].schema_class()


def _field(
    stage: StageSpec,
    schema: type[BaseModel],
    rule: str,
    path: str,
    kind: Kind,
    written: str | None = None,
) -> None:
    """The dotted `path` leads through `schema`'s fields (and those of the models they hold) to
    a field of `kind`; `written`: the rule's value as the spec gives it, if not `path`."""
    written = written or path
    model: type[BaseModel] | None = schema
    annotation: Any = None
    for step in path.split("."):
        if model is None or step not in model.model_fields:
            where = f"{schema.__module__}:{schema.__qualname__}"
            owner = "" if model is schema else f" ({model.__qualname__ if model else 'a value'})"
            raise ValueError(
                f"stage {stage.name!r}: {rule} names {written!r}, but the output schema {where}"
                f"{owner} has no field {step!r}"
            )
        annotation = model.model_fields[step].annotation
        model = _model_in(annotation)
    if not _fits(annotation, kind):
        raise ValueError(
            f"stage {stage.name!r}: {rule} names {written!r}, which must hold {kind.value}, not "
            f"{_spelled(annotation)}"
        )


def _leaves(annotation: Any) -> list[Any]:
    """The alternatives of a union (`X | None` gives X and None), else the annotation itself."""
    if isinstance(annotation, UnionType) or get_origin(annotation) is Union:
        return [leaf for arg in get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The one pydantic model a field holds (alone or with None), to step into."""
    models = [
        leaf
        for leaf in _leaves(annotation)
        if isinstance(leaf, type) and issubclass(leaf, BaseModel)
    ]
    return models[0] if len(models) == 1 else None


def _fits(annotation: Any, kind: Kind) -> bool:
    leaves = [leaf for leaf in _leaves(annotation) if leaf is not NoneType]
    if kind == Kind.ANY:
        return True
    if kind == Kind.FLAG:
        return bool in leaves
    if kind == Kind.TEXT:
        return leaves == [str]
    if kind == Kind.LIST:
        return len(leaves) == 1 and get_origin(leaves[0]) in (list, tuple)
    return (
        len(leaves) == 1
        and get_origin(leaves[0]) in (list, tuple)
        and set(get_args(leaves[0])) <= {str, Ellipsis}
    )


def _spelled(annotation: Any) -> str:
    """`str`, `list[str]`, `bool | None`: a type as its annotation reads."""
    if get_origin(annotation) is None and isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")

"""The fixer's renamed twin: the same pipeline with every stage and every field named otherwise.

The engine must not care what a pipeline calls things (issue 23). The twin is made here, from
the fixer itself, so a stage or field the fixer gains is renamed too: its schemas module is the
fixer's source with every field of every schema class renamed (the engine's fact types, which
the fixer's schemas only use, keep theirs), its spec is the fixer's with every stage, every
field a rule names and every template placeholder renamed, and the fake model's scenario is
renamed the same way. A name is renamed by spelling it backwards (`proof` → `foorp`), which
shares no name with the fixer's and keeps a failure readable.

`Names` is one pipeline of the fixer's shape as a test sees it: the fixer (nothing renamed) or
the twin. A test written in the fixer's names translates what it sends (`to_pipeline`) and what
it reads back (`to_fixer`); the reading back is strict, so an output key that is not one of the
pipeline's own names fails the test.
"""

from __future__ import annotations

import ast
import importlib
import json
import keyword
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType, NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
FIXER_SPEC = ROOT / "orchestrator" / "pipelines" / "fixer" / "pipeline.toml"
FIXER_SCHEMAS = "orchestrator.pipelines.fixer.schemas"
TWIN_NAME = "fixer_twin"
TWIN_SCHEMAS = "fixer_twin_schemas"
"""The twin's schemas module: a file of that name in a temporary folder on `sys.path`."""
RULES = frozenset(
    {"name", "instruction", "output_schema", "tools", "budget", "stop_when", "verify", "proof",
     "loop", "reproduce", "publish", "send_back"}
)  # fmt: skip
"""The keys of a fixer stage this module knows how to rename: a key the fixer's spec gains must
be taught here first (`twin_spec` refuses it), so no reference goes unrenamed."""
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z_][a-z0-9_]*)(\?)?\}")


def renamed(name: str) -> str:
    twin = name[::-1]
    assert twin.isidentifier() and not keyword.iskeyword(twin) and twin != name, name
    return twin


def fixer_models() -> dict[str, type[BaseModel]]:
    """The schema classes the fixer's schemas module defines (not those it imports)."""
    module = importlib.import_module(FIXER_SCHEMAS)
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and value.__module__ == FIXER_SCHEMAS
    }


def fixer_field_names() -> set[str]:
    """Every field name of the fixer's schema classes."""
    return {name for model in fixer_models().values() for name in model.model_fields}


def fixer_spec() -> dict[str, Any]:
    spec: dict[str, Any] = tomllib.loads(FIXER_SPEC.read_text())
    return spec


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, alone, with None or in a list."""
    if isinstance(annotation, UnionType) or get_origin(annotation) is Union:
        found = [_model_in(arg) for arg in get_args(annotation) if arg is not NoneType]
        return found[0] if len(found) == 1 else None
    if get_origin(annotation) in (list, tuple):
        return _model_in(get_args(annotation)[0])
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


@dataclass(frozen=True, eq=False)
class Names:
    """A pipeline of the fixer's shape and how its names read (one value per pipeline and
    process: `fixer()` and `twin()` are cached, so it hashes by identity)."""

    pipeline: str
    """What `load_pipeline` takes: `fixer`, or the twin spec's path."""
    stages: Mapping[str, str]
    """The fixer's stage names (and output keys) to this pipeline's."""
    fields: Mapping[str, str]
    """The fixer's field names to this pipeline's."""
    schemas: ModuleType
    """This pipeline's schemas module."""
    folder: Path | None = None
    """Where the twin's files are (its schemas module's folder, for `PYTHONPATH`)."""

    @property
    def id(self) -> str:
        return "fixer" if self.folder is None else "twin"

    def stage(self, fixer_stage: str) -> str:
        return self.stages[fixer_stage]

    def field(self, fixer_field: str) -> str:
        return self.fields[fixer_field]

    def queue(self, fixer_stage: str) -> str:
        """The queue of this pipeline's stage of that fixer name (`baton.<pipeline>.<stage>`)."""
        from orchestrator.core.pipeline import load_pipeline

        return load_pipeline(self.pipeline).stage(self.stage(fixer_stage)).queue

    def schema_of(self, fixer_stage: str) -> type[BaseModel]:
        """The fixer schema class of a stage (its name is the twin's class's too)."""
        for stage in fixer_spec()["stages"]:
            if stage["name"] == fixer_stage:
                return fixer_models()[stage["output_schema"].partition(":")[2]]
        raise KeyError(fixer_stage)

    def to_pipeline(self, model: type[BaseModel], value: Any) -> Any:
        """A value of fixer schema `model`, in fixer names, with this pipeline's names."""
        return _translate(model, value, self.fields, back=False)

    def to_fixer(self, model: type[BaseModel], value: Any) -> Any:
        """A value of this pipeline's `model` back in the fixer's names; a key that is not one
        of this pipeline's field names raises KeyError."""
        back = {twin: fixer for fixer, twin in self.fields.items()}
        return _translate(model, value, back, back=True)

    def output(self, fixer_stage: str, value: Mapping[str, Any]) -> dict[str, Any]:
        """A fixer-named output of a stage, in this pipeline's names."""
        translated: dict[str, Any] = self.to_pipeline(self.schema_of(fixer_stage), value)
        return translated

    def output_back(self, fixer_stage: str, value: Mapping[str, Any]) -> dict[str, Any]:
        """This pipeline's output of a stage, in the fixer's names (strictly)."""
        translated: dict[str, Any] = self.to_fixer(self.schema_of(fixer_stage), value)
        return translated

    def script(self, fixer_agent: str, script: Any) -> Any:
        """A fake-model script of a fixer stage, its outputs renamed."""

        def step(one: dict[str, Any]) -> dict[str, Any]:
            return {**one, "json": self.output(fixer_agent, one["json"])} if "json" in one else one

        if fixer_agent not in self.stages:
            return script  # not a stage: the compactor, say
        if isinstance(script, list):
            return [step(one) for one in script]
        renamed_script = {**script, "steps": [step(one) for one in script["steps"]]}
        if "variants" in script:
            renamed_script["variants"] = [
                {**variant, "steps": [step(one) for one in variant["steps"]]}
                for variant in script["variants"]
            ]
        return renamed_script

    def scenario(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """A fake-model scenario written for the fixer, for this pipeline."""
        agents = {
            self.stages.get(agent, agent): self.script(agent, script)
            for agent, script in scenario["agents"].items()
        }
        return {**scenario, "agents": agents}


def _translate(model: type[BaseModel], value: Any, names: Mapping[str, str], back: bool) -> Any:
    """`value` (of the fixer's `model`, or of an engine fact type) with the keys of the fixer's
    own models renamed by `names`: fixer names to the pipeline's, or `back` (strictly: a key
    `names` lacks raises KeyError). The engine's fact types keep their keys."""
    if not isinstance(value, Mapping):
        return value
    own = model.__module__ == FIXER_SCHEMAS
    out: dict[str, Any] = {}
    for key, item in value.items():
        new = (names[key] if back else names.get(key, key)) if own else key
        info = model.model_fields.get(new if back else key)
        inner = _model_in(info.annotation) if info is not None else None
        if inner is not None and isinstance(item, list):
            item = [_translate(inner, one, names, back) for one in item]
        elif inner is not None:
            item = _translate(inner, item, names, back)
        out[new] = item
    return out


@cache
def fixer() -> Names:
    module = importlib.import_module(FIXER_SCHEMAS)
    stages = {stage["name"]: stage["name"] for stage in fixer_spec()["stages"]}
    return Names("fixer", stages, {name: name for name in fixer_field_names()}, module)


@cache
def twin(folder: Path) -> Names:
    """The twin, written into `folder` and importable from there (`folder` joins `sys.path`)."""
    folder.mkdir(parents=True, exist_ok=True)
    fields = {name: renamed(name) for name in fixer_field_names()}
    stages = {stage["name"]: renamed(stage["name"]) for stage in fixer_spec()["stages"]}
    assert not (set(fields.values()) | set(stages.values())) & (set(fields) | set(stages))
    (folder / f"{TWIN_SCHEMAS}.py").write_text(twin_schemas_source(fields))
    spec = twin_spec(fixer_spec(), stages, fields)
    path = folder / f"{TWIN_NAME}.toml"
    path.write_text(toml_text(spec))
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module = importlib.import_module(TWIN_SCHEMAS)
    return Names(str(path), stages, fields, module, folder)


def twin_schemas_source(fields: Mapping[str, str]) -> str:
    """The fixer's schemas module with every field of its own classes renamed."""
    source = Path(importlib.import_module(FIXER_SCHEMAS).__file__ or "").read_text()
    tree = ast.parse(source)
    own = set(fixer_models()) | {"_Output"}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in own:
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    statement.target.id = fields[statement.target.id]
    return ast.unparse(tree) + "\n"


@dataclass(frozen=True)
class _Renaming:
    """How the twin renames what a fixer spec says."""

    stages: Mapping[str, str]
    fields: Mapping[str, str]

    def source(self, value: str) -> str:
        """`<output key>.<field>` of an earlier stage."""
        key, _, name = value.rpartition(".")
        return f"{self.stages[key]}.{self.fields[name]}"

    def path(self, schema: type[BaseModel], value: str) -> str:
        """A dotted path into an output of `schema`: the fixer's fields renamed, the fields of
        the engine's fact types (`proof.passed`'s `passed`) kept."""
        parts: list[str] = []
        model: type[BaseModel] | None = schema
        for part in value.split("."):
            own = model is not None and model.__module__ == FIXER_SCHEMAS
            parts.append(self.fields[part] if own else part)
            model = _model_in(model.model_fields[part].annotation) if model else None
        return ".".join(parts)

    def instruction(self, template: str) -> str:
        def placeholder(match: re.Match[str]) -> str:
            key = match.group(1)
            if key is None or key not in self.stages:
                return match.group(0)  # `{issue}`, `{previous_attempt?}`, a literal brace
            return "{" + self.stages[key] + (match.group(2) or "") + "}"

        return _PLACEHOLDER.sub(placeholder, template)

    def rule(self, key: str, value: Any, schema: type[BaseModel]) -> Any:
        """One key of a stage, renamed."""
        if key == "stop_when":
            named = {"field": self.fields[value["field"]]}
            if "reason_field" in value:
                named["reason_field"] = self.fields[value["reason_field"]]
            return {**value, **named}
        if key == "verify":
            return {**value, "command_from": self.source(value["command_from"])}
        if key == "proof":
            named = {"reproduction_from": self.stages[value["reproduction_from"]]}
            if "publishable_by" in value:
                named["publishable_by"] = self.stages[value["publishable_by"]]
            return {**value, **named}
        if key == "loop":
            paths = ("until", "reason_from", "summary_from")
            return {k: self.path(schema, v) if k in paths else v for k, v in value.items()}
        if key == "send_back":
            return _send_back(self, value, schema)
        if key == "reproduce":
            return {k: self.fields[v] for k, v in value.items()}
        if key == "publish":
            planned = value.get("planned_from", [])
            planned = [planned] if isinstance(planned, str) else planned
            return {**value, "planned_from": [self.source(one) for one in planned]}
        return value  # tools, budget: no names of the fixer's


def _send_back(renaming: _Renaming, value: Any, schema: type[BaseModel]) -> dict[str, Any]:
    unless = value["unless"]
    unless = [unless] if isinstance(unless, str) else unless
    named = {"to": renaming.stages[value["to"]],
             "unless": [renaming.path(schema, one) for one in unless]}  # fmt: skip
    if "reason_from" in value:
        named["reason_from"] = renaming.path(schema, value["reason_from"])
    return {**value, **named}


def twin_spec(
    spec: Mapping[str, Any], stages: Mapping[str, str], fields: Mapping[str, str]
) -> dict[str, Any]:
    """The fixer's spec with its stages, the fields its rules name and its placeholders
    renamed, its schemas taken from the twin's module."""
    renaming = _Renaming(stages, fields)
    twin_stages = []
    for stage in spec["stages"]:
        unknown = set(stage) - RULES
        assert not unknown, f"tests/twin.py does not know how to rename {unknown}"
        schema_name = stage["output_schema"].partition(":")[2]
        schema = fixer_models()[schema_name]
        new = {key: renaming.rule(key, value, schema) for key, value in stage.items()}
        new["name"] = stages[stage["name"]]
        new["output_schema"] = f"{TWIN_SCHEMAS}:{schema_name}"
        new["instruction"] = renaming.instruction(stage["instruction"])
        twin_stages.append(new)
    return {**spec, "name": TWIN_NAME, "stages": twin_stages}


def toml_text(spec: Mapping[str, Any]) -> str:
    """A pipeline spec as TOML: its top-level values, then one `[[stages]]` table each."""
    lines = [f"{key} = {_toml(value)}" for key, value in spec.items() if key != "stages"]
    for stage in spec["stages"]:
        lines += ["", "[[stages]]", *(f"{key} = {_toml(value)}" for key, value in stage.items())]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(one) for one in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{key} = {_toml(one)}" for key, one in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")

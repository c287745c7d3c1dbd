"""A host tool's function, read as the worker wraps it: imported by path, its parameters split
into those the model fills and those the declaration binds, and every way it cannot run.

`orchestrator.core.toolcheck` reports the problems (`host_problems`) when a pipeline loads; the
worker wraps the function from the same reading (`host_signature`, `workers.tools.host`).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr, TypeAdapter

from orchestrator.core.tools import HostTool, ToolModel, ToolRun

RESERVED_PARAMETERS = frozenset({"tool_context", "input_stream"})
"""Parameters ADK fills itself (the session's context): never a declared tool's."""


@dataclass(frozen=True)
class HostSignature:
    """A host tool's function as the worker wraps it."""

    function: Callable[..., Any]
    parameters: tuple[inspect.Parameter, ...]
    """The parameters the model fills, their annotations resolved."""
    returns: Any
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    """Parameter = value, as the parameter's type reads it."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Parameter = variable of the worker's environment."""
    secret_strs: frozenset[str] = frozenset()
    """The secret parameters annotated `SecretStr` (the others get a plain `str`)."""
    environment: dict[str, str] = field(default_factory=dict)
    """Parameter = variable of the worker's environment, not secret."""
    required_environment: frozenset[str] = frozenset()
    """The parameters of `environment` without a default: their variable must be set."""
    model_client: str | None = None
    """The parameter annotated `ToolModel`, if any."""
    run: str | None = None
    """The parameter annotated `ToolRun`, if any."""


def host_signature(declaration: HostTool) -> HostSignature:
    """The declaration's function, read as the worker wraps it.

    Raises:
        ValueError: the function cannot run as a tool; the message says why.
    """
    signature, problems = _analysed(declaration)
    if signature is None or problems:
        raise ValueError("; ".join(f"{at.lstrip('.')}: {message}" for at, message in problems))
    return signature


def import_function(path: str) -> Callable[..., Any]:
    """The function at `module:name`.

    Raises:
        ValueError: its module does not import, or has no such name.
    """
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # importing runs the module: it may raise anything
        raise ValueError(f"{path!r} cannot be imported: {exc or type(exc).__name__}") from exc
    if not hasattr(module, attribute):
        raise ValueError(f"{path!r}: module {module_name!r} has no {attribute!r}")
    found: Callable[..., Any] = getattr(module, attribute)
    return found


def _analysed(declaration: HostTool) -> tuple[HostSignature | None, list[tuple[str, str]]]:
    try:
        function = import_function(declaration.function)
    except ValueError as exc:
        return None, [(".function", str(exc))]
    path = declaration.function
    if not inspect.isfunction(function):
        return None, [(".function", f"{path!r} is not a function (def or async def)")]
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        return None, [(".function", f"{path!r} is a generator; a tool's function returns")]
    try:
        hints = typing.get_type_hints(function)
    except Exception as exc:  # an annotation naming what its module does not import
        return None, [(".function", f"its annotations cannot be resolved: {exc}")]
    reader = _Reader(declaration, hints)
    for parameter in inspect.signature(function).parameters.values():
        reader.read(parameter)
    problems = reader.problems
    groups = (("settings", declaration.settings), ("secrets", declaration.secrets),
              ("environment", declaration.environment))  # fmt: skip
    for group, names in groups:
        problems += [
            (f".{group}.{name}", f"names parameter {name!r}, which {path} does not have")
            for name in names
            if name not in reader.seen
        ]
    if "return" not in hints:
        problems.append((".function", "has no return annotation; a tool's function is typed"))
    description = declaration.description or inspect.getdoc(function) or ""
    if not description.strip():
        problems.append((".description", "the function has no docstring and the declaration no "
                         "description: the model reads it to know what the tool does"))  # fmt: skip
    return HostSignature(
        function=function,
        parameters=tuple(reader.parameters),
        returns=hints.get("return"),
        description=description,
        settings=reader.settings,
        secrets=dict(declaration.secrets),
        secret_strs=frozenset(reader.secret_strs),
        environment=dict(declaration.environment),
        required_environment=frozenset(reader.required_environment),
        model_client=reader.model_client,
        run=reader.run,
    ), problems


class _Reader:
    """Reads a host function's parameters one by one: which the model fills, which the
    declaration binds, and what is wrong with each."""

    def __init__(self, declaration: HostTool, hints: dict[str, Any]) -> None:
        self.declaration, self.hints = declaration, hints
        self.problems: list[tuple[str, str]] = []
        self.parameters: list[inspect.Parameter] = []
        self.settings: dict[str, Any] = {}
        self.secret_strs: set[str] = set()
        self.required_environment: set[str] = set()
        self.model_client: str | None = None
        self.run: str | None = None
        self.seen: set[str] = set()

    def read(self, parameter: inspect.Parameter) -> None:
        name, hint = parameter.name, self.hints.get(parameter.name)
        self.seen.add(name)
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            self._wrong(f"parameter {name!r} must be a named one (no *args, **kwargs or "
                        "positional-only parameters)")  # fmt: skip
        elif name in RESERVED_PARAMETERS:
            self._wrong(f"parameter {name!r} is reserved: ADK would hand it the session's context")
        elif self._filled_by_baton(parameter, hint):
            pass
        elif hint is None:
            self._wrong(f"parameter {name!r} has no type annotation")
        else:
            try:
                TypeAdapter(hint).json_schema()
            except Exception as exc:  # pydantic's several errors for a type it cannot describe
                self._wrong(
                    f"parameter {name!r}: the model cannot be told its type {hint!r}: {exc}"
                )
            self.parameters.append(parameter.replace(annotation=hint))

    def _filled_by_baton(self, parameter: inspect.Parameter, hint: Any) -> bool:
        """Whether Baton fills the parameter (a model client, the run, the declaration's
        environment, secrets or settings), reading it as such; False: the model fills it."""
        name = parameter.name
        if hint is ToolModel:
            if self.model_client is not None:
                self._wrong("has two ToolModel parameters; one is enough")
            self.model_client = name
        elif hint is ToolRun:
            if self.run is not None:
                self._wrong("has two ToolRun parameters; one is enough")
            self.run = name
        elif name in self.declaration.environment:
            self._environment(parameter, hint)
        elif name in self.declaration.secrets:
            self._secret(name, hint)
        elif name in self.declaration.settings:
            self._setting(name, hint)
        else:
            return False
        return True

    def _wrong(self, message: str, at: str = ".function") -> None:
        self.problems.append((at, message))

    def _secret(self, name: str, hint: Any) -> None:
        if name in self.declaration.settings:
            self._wrong("is also given in settings", f".secrets.{name}")
        if hint not in (str, SecretStr):
            self._wrong(f"parameter {name!r} holds a secret, so it is annotated `str` or "
                        "`SecretStr`", f".secrets.{name}")  # fmt: skip
        if hint is SecretStr:
            self.secret_strs.add(name)

    def _environment(self, parameter: inspect.Parameter, hint: Any) -> None:
        name, at = parameter.name, f".environment.{parameter.name}"
        if name in self.declaration.settings or name in self.declaration.secrets:
            self._wrong("is also given in settings or secrets", at)
        if hint is not str:
            self._wrong(f"parameter {name!r} is filled from an environment variable, so it is "
                        "annotated `str`", at)  # fmt: skip
        if parameter.default is parameter.empty:
            self.required_environment.add(name)

    def _setting(self, name: str, hint: Any) -> None:
        value = self.declaration.settings[name]
        try:
            self.settings[name] = TypeAdapter(Any if hint is None else hint).validate_python(value)
        except Exception as exc:  # pydantic's ValidationError, or a type it cannot validate
            said = str(exc).splitlines()[-1].strip()
            self._wrong(f"{value!r} does not fit the parameter's type {hint!r}: {said}",
                        f".settings.{name}")  # fmt: skip


def host_problems(declaration: HostTool) -> Iterator[tuple[str, str]]:
    """(where in the declaration, what is wrong) for each reason its function cannot run."""
    yield from _analysed(declaration)[1]

"""Tool scoping and argument checks for one stage execution, enforced in code.

A stage's model may call only the stage's own tools, with arguments that fit their signatures,
whatever the issue text told it. ADK on its own answers a call to an unknown tool with an error
the model reads, passes arguments of the wrong type to the function unchecked, and lets a model
try either as often as its model-call budget allows. A `ToolGuard` closes all three through two
ADK callbacks:

- `after_model`, an `after_model_callback`: a function call in a reply that names a tool the
  stage does not have is a bad call (triage has no tools, so any call it makes is one);
- `before_tool`, a `before_tool_callback`: answers that call with an error instead of ADK's, and
  checks every other call's arguments against the tool function's signature; a call that does
  not fit is a bad call and the tool does not run.

Every bad call is counted. The first `max_bad_calls` are answered with `{"error": ...}`, which
the model reads and can act on: that is its repair turn. The next raises `StageError` naming the
stage, the tool and what was wrong; the stage fails and the run ends with that reason. A reply
holding more out-of-scope calls than are left fails before any of its calls runs.

Arguments are checked in pydantic's strict mode: each must already have its annotated type as
JSON gives it (a string for `str`, a whole number for `int`, a number for `float`, true/false for
`bool`), nothing is converted, unknown arguments are refused and required ones must be there.
A model that sends `"5"` for a line number is told so and sends `5`, rather than having Baton
guess; the function then runs with exactly the values the model sent.

One guard serves one stage execution: make a fresh one for each agent built, so that its count
starts at zero and nothing of it outlives the execution.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NotRequired, Required

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from workers.errors import StageError

logger = logging.getLogger(__name__)

__all__ = ["ToolGuard"]

UNNAMED = "<unnamed>"
"""The name ADK gives a function call without one."""
INJECTED_PARAMETERS = frozenset({"tool_context", "input_stream"})
"""Parameters ADK fills in itself; the model never sends them."""
MAX_PROBLEM_CHARS = 500
"""What a refusal says about the arguments is cut to this many characters."""


class ToolGuard:
    """Keeps one stage execution's model to its own tools, called with valid arguments.

    `allowed` is the stage's tools: the functions themselves (their arguments are checked
    against their signatures) or only their names (arguments are then checked against the
    function of the ADK `FunctionTool` called). Attach `after_model` as the agent's
    `after_model_callback` and `before_tool` as its `before_tool_callback`.
    """

    def __init__(
        self,
        allowed: Sequence[Callable[..., Any]] | Sequence[str],
        *,
        stage: str,
        max_bad_calls: int = 1,
    ) -> None:
        self.stage = stage
        self.max_bad_calls = max_bad_calls
        self.bad_calls: list[str] = []
        """What was wrong with each bad call so far, oldest first."""
        self._functions: dict[str, Callable[..., Any] | None] = dict(map(_named, allowed))
        self._adapters: dict[str, TypeAdapter[Any]] = {}
        self._counted: Counter[str] = Counter()
        """Out-of-scope calls `after_model` counted that `before_tool` has yet to answer."""

    @property
    def tools(self) -> tuple[str, ...]:
        """The names of the stage's tools."""
        return tuple(self._functions)

    def after_model(
        self, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        """Count the reply's calls to tools the stage does not have; leaves the reply as is.

        Raises:
            StageError: one of them is a bad call past the stage's allowance.
        """
        if llm_response.partial or llm_response.content is None:
            return None
        for part in llm_response.content.parts or []:
            if part.function_call is None:
                continue
            name = part.function_call.name or UNNAMED
            if name not in self._functions:
                self._count(name, self._out_of_scope())
                self._counted[name] += 1
        return None

    def before_tool(
        self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        """`None` to let a valid call run; else the error the model reads in place of a result.

        Raises:
            StageError: the call is a bad call past the stage's allowance.
        """
        if tool.name not in self._functions:
            problem = self._out_of_scope()
            if self._counted[tool.name]:
                self._counted[tool.name] -= 1
            else:
                self._count(tool.name, problem)
            others = ", ".join(self._functions)
            advice = f"call one of {others} instead" if others else "reply without calling a tool"
            return self._refusal(f"{shown(tool.name)}: {problem}; {advice}")
        function = self._functions[tool.name] or (
            tool.func if isinstance(tool, FunctionTool) else None
        )
        wrong = None if function is None else self.argument_problem(tool.name, function, args)
        if function is None or wrong is None:
            return None
        self._count(tool.name, wrong)
        usage = f"{tool.name}({describe_parameters(function)})"
        return self._refusal(f"{tool.name}: {wrong}; call it again as {usage}")

    def argument_problem(
        self, name: str, function: Callable[..., Any], args: Mapping[str, Any]
    ) -> str | None:
        """What is wrong with calling `function` (the tool `name`) with `args`, or `None`."""
        adapter = self._adapters.get(name)
        if adapter is None:
            adapter = self._adapters[name] = TypeAdapter(arguments_type(name, function))
        try:
            adapter.validate_python(dict(args), strict=True)
        except ValidationError as exc:
            text = "; ".join(_describe(error) for error in exc.errors(include_url=False))
            return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS] + "…"
        return None

    def _out_of_scope(self) -> str:
        tools = ", ".join(self._functions) or "none"
        return f"not a tool of the {self.stage} stage (its tools: {tools})"

    def _count(self, tool: str, problem: str) -> None:
        """Count one bad call; past the allowance, fail the stage."""
        self.bad_calls.append(problem)
        count = len(self.bad_calls)
        logger.info("stage %s: bad tool call %d to %s", self.stage, count, tool)
        if count > self.max_bad_calls:
            raise StageError(
                f"stage {self.stage!r} made {count} bad tool calls, more than the "
                f"{self.max_bad_calls} it may repair; the last, {shown(tool)}: {problem}"
            )

    def _refusal(self, message: str) -> dict[str, Any]:
        if len(self.bad_calls) == self.max_bad_calls:
            message += ". This was the stage's last allowed bad tool call: another ends the stage"
        return {"error": message}


def _named(tool: Callable[..., Any] | str) -> tuple[str, Callable[..., Any] | None]:
    return (tool, None) if isinstance(tool, str) else (tool.__name__, tool)


def shown(name: str) -> str:
    """A tool name as messages show it: as it is when it is a plain name, else quoted."""
    return name if name.isidentifier() and len(name) <= 64 else repr(name[:64])


def type_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's resolved annotations; none when they cannot be resolved."""
    try:
        return typing.get_type_hints(function)
    except (NameError, TypeError):
        return {}


def arguments_type(name: str, function: Callable[..., Any]) -> Any:
    """A `TypedDict` of the arguments the model may send to `function`, refusing others."""
    hints = type_hints(function)
    fields: dict[str, Any] = {}
    extra: Literal["forbid", "allow"] = "forbid"
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in INJECTED_PARAMETERS or parameter.kind is parameter.VAR_POSITIONAL:
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        annotation = hints.get(parameter.name, Any)
        required = parameter.default is parameter.empty
        fields[parameter.name] = Required[annotation] if required else NotRequired[annotation]
    arguments = TypedDict(f"{name}_arguments", fields)  # type: ignore[misc]
    arguments.__pydantic_config__ = ConfigDict(extra=extra)  # type: ignore[attr-defined]
    return arguments


def describe_parameters(function: Callable[..., Any]) -> str:
    """`path: str, start_line: int = 1`: the parameters as the model should send them."""
    hints = type_hints(function)
    parts = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in INJECTED_PARAMETERS or parameter.kind is parameter.VAR_POSITIONAL:
            continue
        annotation = hints.get(parameter.name, Any)
        kind = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        default = "" if parameter.default is parameter.empty else f" = {parameter.default!r}"
        parts.append(f"{parameter.name}: {kind}{default}")
    return ", ".join(parts)


def _describe(error: Any) -> str:
    loc = (f"[{part}]" if isinstance(part, int) else f".{shown(part)}" for part in error["loc"])
    where = "".join(loc).removeprefix(".") or "(arguments)"
    if error["type"] == "missing":
        return f"{where}: missing, and it is required"
    if error["type"] == "extra_forbidden":
        return f"{where}: no such argument"
    return f"{where}: {error['msg'].lower()}, got {_json_type(error.get('input'))}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"

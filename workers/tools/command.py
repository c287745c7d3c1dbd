"""Sandbox command tools: a command template with typed arguments, run in the stage's sandbox.

The template was checked when the pipeline loaded (`orchestrator.core.toolcheck`): each element of
`command` and each value of `env` is literal text or exactly one `{argument}`. Here an element
that is exactly `{argument}` becomes that argument's value, whole, as one argv element or one
variable; every other element is passed as the literal text it is (`{{`/`}}` as braces), so
even a template that escaped the check could not splice a value into a string. The command runs
through the workspace (`Workspace.run`: the sandbox's `exec`, no shell), so `$(…)`, `;` and
backticks in a value are bytes of one argument, never syntax.

The model sees a function with one keyword parameter per argument (their types, defaults and
descriptions from the declaration), so ADK declares it and the stage's `ToolGuard` checks the
model's values before the command runs. It gets back the exit code, whether the time limit
ended the command, and its output, which the stage's tool-output budget cuts like any tool's.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from google.adk.tools.function_tool import FunctionTool

from orchestrator.core.tools import CommandArg, CommandTool, literal_text, template_argument
from workers.tools.errors import ToolError
from workers.tools.workspace import Workspace


def command_tool(
    name: str, declaration: CommandTool, workspace: Workspace, *, timeout_s: float
) -> FunctionTool:
    """The tool `name`: `declaration`'s command in `workspace`, killed after `timeout_s` (the
    declaration's own limit, when lower)."""
    limit_s = min(timeout_s, declaration.timeout_s)
    defaults = {
        key: arg.default for key, arg in declaration.args.items() if arg.default is not None
    }

    def run(**arguments: Any) -> dict[str, Any]:
        try:
            values = {key: _as_text(key, value, declaration.args.get(key))
                      for key, value in {**defaults, **arguments}.items()}  # fmt: skip
            argv = [_filled(element, values) for element in declaration.command]
            env = {key: _filled(value, values) for key, value in declaration.env.items()}
            result = workspace.run(argv, timeout_s=limit_s, env=env)
        except ToolError as exc:
            return {"error": exc.message}
        answer: dict[str, Any] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "output": result.output,
        }
        if result.timed_out:
            answer["note"] = f"killed after {limit_s:g} s"
        return answer

    parameters = [
        inspect.Parameter(
            key,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=arg.python_type,
            default=inspect.Parameter.empty if arg.default is None else arg.default,
        )
        for key, arg in declaration.args.items()
    ]
    run.__signature__ = inspect.Signature(parameters, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": dict[str, Any]}
    run.__name__ = run.__qualname__ = name
    run.__doc__ = _docstring(declaration)
    return FunctionTool(run)


def _filled(element: str, values: dict[str, str]) -> str:
    """A template element: the whole value of the argument it is, or its literal text."""
    argument = template_argument(element)
    if argument is None:
        return literal_text(element)
    if argument not in values:
        raise ToolError(f"argument {argument!r} is missing; give it")
    return values[argument]


def _as_text(key: str, value: Any, arg: CommandArg | None) -> str:
    """An argument's value as the text passed to the command; a string must match its pattern
    and no value may hold a NUL (an argv element cannot)."""
    if arg is None:
        raise ToolError(f"there is no argument {key!r}")
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if "\0" in text:
        raise ToolError(f"argument {key!r} holds a NUL character, which no command takes")
    if arg.pattern is not None and not re.fullmatch(arg.pattern, text):
        raise ToolError(f"argument {key!r} must match {arg.pattern!r}; {text[:80]!r} does not")
    return text


def _docstring(declaration: CommandTool) -> str:
    """What the model reads of the tool: its description, then one line per argument."""
    lines = [declaration.description.strip(), "", "Runs a command in the repository's sandbox "
             "and returns its exit code and output."]  # fmt: skip
    if declaration.args:
        lines += ["", "Args:"]
        for key, arg in declaration.args.items():
            said = arg.description.strip().rstrip(".") + "."
            said += f" One of {', '.join(map(repr, arg.enum))}." if arg.enum else ""
            said += f" Must match {arg.pattern!r}." if arg.pattern else ""
            lines.append(f"    {key}: {said}")
    return "\n".join(lines)

"""What makes a pipeline's tools wrong, found before a run: `check_tools(pipeline)`.

`load_pipeline` calls it and refuses a pipeline with any problem (so an enqueue does too, before
a model call is spent); `baton pipeline check` shows them all. Each problem names the tool, the
stages that name it and the field in the file. A host tool's function is read by
`orchestrator.core.hostfunction`, as the worker wraps it, so what is checked is what runs.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.core.delegation import DELEGATE_TOOL
from orchestrator.core.hostfunction import RESERVED_PARAMETERS, host_problems
from orchestrator.core.tools import (
    BUILTIN_TOOLS,
    ENV_NAME,
    MCP_TOOL_NAME,
    RUNS_CODE,
    TOOL_NAME,
    CommandArg,
    CommandTool,
    HostTool,
    McpServer,
    ToolDeclaration,
    template_argument,
)

if TYPE_CHECKING:
    from orchestrator.core.pipeline import Pipeline, StageSpec

ONE_ARGUMENT = (
    "an element is either literal text (`{{`, `}}` for braces) or exactly one `{argument}`, "
    "passed whole"
)
SPLICED_NAME = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class ToolProblem:
    """Why a pipeline's tool cannot run: the tool, the stages that name it (none: a declaration
    no stage uses), where in the file (`field`, e.g. `tools.lookup.command[2]`) and what."""

    tool: str
    message: str
    stages: tuple[str, ...] = ()
    field: str = ""

    def __str__(self) -> str:
        named = ", ".join(repr(stage) for stage in self.stages)
        where = f"stage{'s' if len(self.stages) > 1 else ''} {named}, " if named else ""
        at = f" ({self.field})" if self.field else ""
        return f"{where}tool {self.tool!r}{at}: {self.message}"

    def describe(self, origin: str) -> str:
        """The problem as one line that names the pipeline file (`origin`) too."""
        return f"{origin}: {self}"


def check_tools(pipeline: Pipeline) -> list[ToolProblem]:
    """Every problem of the pipeline's tools: a name a stage gives that is neither built-in
    nor declared, a declaration that cannot run (a function that does not import or is not
    typed, a template that splices an argument into a string, an MCP server without an
    address), a name a stage's model would be offered twice. Imports the host tools' modules."""
    problems: list[ToolProblem] = []
    for name, declaration in pipeline.tools.items():
        users = tuple(stage.name for stage in pipeline.stages if name in stage.tools)
        problems += [
            ToolProblem(name, message, users, f"tools.{name}{at}")
            for at, message in declaration_problems(name, declaration)
        ]
    for index, stage in enumerate(pipeline.stages):
        problems += _stage_problems(stage, f"stages[{index}].tools", pipeline.tools)
    return problems


def _stage_problems(
    stage: StageSpec, field: str, declared: Mapping[str, ToolDeclaration]
) -> Iterator[ToolProblem]:
    """A stage's names that are neither built-in nor declared, or that offer its model a tool
    name twice."""
    offered: dict[str, str] = {}
    for position, tool in enumerate(stage.tools):
        where = f"{field}[{position}]"
        found = declared.get(tool)
        if tool == DELEGATE_TOOL and found is None:
            offered.setdefault(tool, tool)
            continue
        if tool not in BUILTIN_TOOLS and found is None:
            known = ", ".join(declared) or "none"
            message = (f"is neither a built-in tool ({', '.join(BUILTIN_TOOLS)}) nor declared "
                       f"in a [tools.{tool}] table (declared: {known})")  # fmt: skip
            yield ToolProblem(tool, message, (stage.name,), where)
            continue
        for name in found.tools if isinstance(found, McpServer) else (tool,):
            if name in offered:
                message = f"offers the model a tool named {name!r}, as {offered[name]!r} does"
                yield ToolProblem(tool, message, (stage.name,), where)
            offered.setdefault(name, tool)


def declaration_problems(name: str, declaration: ToolDeclaration) -> Iterator[tuple[str, str]]:
    """(where in the declaration, what is wrong) for each problem of one declaration."""
    if not TOOL_NAME.match(name):
        yield "", "a tool's name is a letter or _, then letters, digits or _ (64 at most)"
    if name in (*BUILTIN_TOOLS, DELEGATE_TOOL):
        yield "", "is the name of a built-in tool; give the declared one another name"
    if isinstance(declaration, HostTool):
        yield from host_problems(declaration)
    elif isinstance(declaration, CommandTool):
        yield from _command_problems(declaration)
    else:
        yield from _mcp_problems(declaration)


def _spliced(element: str) -> bool:
    """Whether a template element holds a brace that neither escapes one nor makes it exactly
    one `{argument}`."""
    unescaped = element.replace("{{", "").replace("}}", "")
    return template_argument(element) is None and ("{" in unescaped or "}" in unescaped)


def _command_problems(tool: CommandTool) -> Iterator[tuple[str, str]]:
    if template_argument(tool.command[0]) is not None:
        yield ".command[0]", "the program is not the model's to choose: make it literal text"
    yield from _env_problems(tool.env)
    elements = [(f".command[{i}]", element) for i, element in enumerate(tool.command)]
    elements += [(f".env.{key}", value) for key, value in tool.env.items()]
    used: set[str] = set()
    for at, element in elements:
        argument = template_argument(element)
        if _spliced(element):
            used.update(SPLICED_NAME.findall(element))  # one problem for it, not two
            yield at, f"{element!r} splices into a string: {ONE_ARGUMENT}"
        elif argument is not None and argument not in tool.args:
            yield at, f"names {{{argument}}}, which `args` does not declare"
        elif argument is not None:
            used.add(argument)
    for name, arg in tool.args.items():
        yield from ((f".args.{name}{at}", message) for at, message in _argument_problems(name, arg))
        if name not in used:
            yield f".args.{name}", "is declared, but neither `command` nor `env` passes it"


def _env_problems(env: dict[str, str]) -> Iterator[tuple[str, str]]:
    for key, value in env.items():
        if not re.match(ENV_NAME, key):
            yield f".env.{key}", "is not a variable name"
        elif template_argument(value) is not None and RUNS_CODE.match(key):
            yield f".env.{key}", "decides what code runs, so the model may not fill it"


def _argument_problems(name: str, arg: CommandArg) -> Iterator[tuple[str, str]]:
    if not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED_PARAMETERS:
        yield "", "an argument's name is a Python identifier, not a keyword or a reserved name"
    if arg.pattern is not None:
        if arg.type != "string":
            yield ".pattern", "only a string argument has a pattern"
        try:
            re.compile(arg.pattern)
        except re.error as exc:
            yield ".pattern", f"is not a regular expression: {exc}"
    kinds: dict[str, tuple[type, ...]] = {
        "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)
    }  # fmt: skip
    for at, value in [(".default", arg.default), *((".enum", value) for value in arg.enum)]:
        if value is None:
            continue
        if isinstance(value, bool) != (arg.type == "boolean") or not isinstance(
            value, kinds[arg.type]
        ):
            yield at, f"{value!r} is not of the argument's type, {arg.type}"


def _mcp_problems(server: McpServer) -> Iterator[tuple[str, str]]:
    if bool(server.command) == bool(server.url):
        yield "", "give exactly one of `command` (a stdio server) or `url` (streamable HTTP)"
    if server.url and not re.match(r"^https?://[^\s/]+", server.url):
        yield ".url", "is not an http:// or https:// URL"
    if server.url and server.env:
        yield ".env", "is for a stdio server (`command`); an HTTP server takes `headers`"
    if server.command and server.headers:
        yield ".headers", "are for an HTTP server (`url`); a stdio server takes `env`"
    for index, tool in enumerate(server.tools):
        if not MCP_TOOL_NAME.match(tool):
            yield f".tools[{index}]", f"{tool!r} is not a tool name"
    names = [("env", key) for key in server.env]
    names += [("secrets", key) for key in server.secrets] if server.command else []
    for group, key in names:
        if not re.match(ENV_NAME, key):
            yield f".{group}.{key}", "is not a variable name"

"""A stage's tools, whatever their kind, in one shape: ADK tools behind one guard, one budget,
one audit.

Every kind of tool has an opener of one signature (`OpenTool`): given a tool's name, its
declaration, what the execution lends its tools (`ToolBench`) and the secrets the declaration
names, it yields the ADK tools (`BaseTool`) the stage's model is offered, for as long as the
stage runs. The kinds are the declared ones (`host`, `command`, `mcp`) and the built-in code
tools; `open_toolbox` opens every tool a stage names, in the order it names them.

They all reach the model through the one agent `workers.agent.build_agent` builds, so the same
path serves each: the safe point before every call, the `ToolGuard` (only the stage's tool names;
arguments checked against the function of a `FunctionTool`, which every kind but MCP is; an MCP
server checks its own against its schema), `Toolbox.review` (secrets out of every result, a
dead MCP server stopped), the stage's tool-output budget, the session's audit of every call and
result, and the stage's usage for any model call a tool makes (`workers.tools.model`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool

from orchestrator.core.facts import Fact
from orchestrator.core.tools import (
    CommandTool,
    HostTool,
    McpServer,
    ToolDeclaration,
    ToolModel,
    ToolRun,
)
from workers.errors import StageError
from workers.tools.command import command_tool
from workers.tools.host import host_tool
from workers.tools.mcp import lost_connection, mcp_tools
from workers.tools.secrets import Secrets
from workers.tools.workspace import Workspace


@dataclass(frozen=True)
class ToolBench:
    """What one stage execution lends its tools."""

    stage: str
    workspace: Workspace | None = None
    """The stage's sandbox, where built-in and command tools work; None for a stage without."""
    builtins: Sequence[Callable[..., Any]] = ()
    """The built-in code tools the stage names, built over `workspace` (`workers.tools.code`)."""
    environ: Mapping[str, str] = field(default_factory=dict)
    """The worker's environment, where declared secrets are read by name."""
    command_timeout_s: float = 60.0
    """The most a command tool may run (its declaration may say less)."""
    model: Callable[[str, Secrets], ToolModel] | None = None
    """The model for the host tool named, whose secrets leave its prompts; None: none."""
    run: ToolRun | None = None
    """The run the stage serves, for a host tool that asks for it; None: none."""
    record: Callable[[Fact, Any], None] | None = None
    """Records a fact a host tool's result holds (a `Publication`); None: none is kept."""


class OpenTool(Protocol):
    """Opens the tool `name` of one kind for one stage execution."""

    def __call__(
        self, name: str, declaration: Any, bench: ToolBench, secrets: Secrets
    ) -> AbstractAsyncContextManager[list[BaseTool]]: ...


@asynccontextmanager
async def _host(
    name: str, declaration: HostTool, bench: ToolBench, secrets: Secrets
) -> AsyncIterator[list[BaseTool]]:
    make = bench.model
    model = (lambda: make(name, secrets)) if make is not None else None
    yield [host_tool(name, declaration, stage=bench.stage, secrets=secrets, model=model,
                     environ=bench.environ, run=bench.run, record=bench.record)]  # fmt: skip


@asynccontextmanager
async def _command(
    name: str, declaration: CommandTool, bench: ToolBench, secrets: Secrets
) -> AsyncIterator[list[BaseTool]]:
    if bench.workspace is None:
        raise StageError(f"tool {name!r} of stage {bench.stage!r} runs in a sandbox; it has none")
    yield [command_tool(name, declaration, bench.workspace, timeout_s=bench.command_timeout_s)]


def _mcp(
    name: str, declaration: McpServer, bench: ToolBench, secrets: Secrets
) -> AbstractAsyncContextManager[list[BaseTool]]:
    return mcp_tools(name, declaration, stage=bench.stage, secrets=secrets)


@asynccontextmanager
async def _builtin(
    name: str, declaration: Any, bench: ToolBench, secrets: Secrets
) -> AsyncIterator[list[BaseTool]]:
    found = [function for function in bench.builtins if function.__name__ == name]
    if not found:
        raise StageError(f"stage {bench.stage!r} names the tool {name!r}, which is not built")
    yield [FunctionTool(found[0])]


KINDS: dict[str, OpenTool] = {"host": _host, "command": _command, "mcp": _mcp}
"""The opener of each kind of declared tool, by the declaration's `kind`."""


@dataclass(frozen=True)
class Toolbox:
    """The tools of one stage execution, open."""

    stage: str
    tools: list[BaseTool]
    secrets: Secrets
    """Every secret the stage's tools were given: none of them leaves a tool."""
    servers: Mapping[str, str]
    """The MCP server behind each MCP tool, by tool name."""

    def review(self, tool: BaseTool, response: Any) -> dict[str, Any]:
        """A tool's result on its way to the model, before the output budget: as a dict, every
        secret value replaced by its name.

        Raises:
            StageError: the result says the MCP server behind the tool has gone.
        """
        if lost_connection(tool, response):
            server = self.servers.get(tool.name, "?")
            raise StageError(
                f"the MCP server {server!r} of stage {self.stage!r} stopped during a call to "
                f"{tool.name}: {self.secrets.redact(response['error'])}"
            )
        return self.secrets.redact(response if isinstance(response, dict) else {"result": response})


@asynccontextmanager
async def open_toolbox(
    names: Sequence[str], declarations: Mapping[str, ToolDeclaration], bench: ToolBench
) -> AsyncIterator[Toolbox]:
    """The tools `names` of the stage, built in or declared, open while the block runs.

    Raises:
        StageError: a tool cannot be opened (an undeclared name, a secret not set, an MCP
            server that does not start); the message names the stage and the tool.
    """
    builtin_names = {function.__name__ for function in bench.builtins}
    tools: list[BaseTool] = []
    secrets = Secrets()
    servers: dict[str, str] = {}
    async with AsyncExitStack() as stack:
        for name in names:
            declaration = declarations.get(name)
            if declaration is None and name not in builtin_names:
                raise StageError(f"stage {bench.stage!r} names the tool {name!r}, which is "
                                 "neither built in nor declared by its pipeline")  # fmt: skip
            own = Secrets.read(_secret_variables(declaration), bench.environ, tool=name,
                               stage=bench.stage)  # fmt: skip
            opener = _builtin if declaration is None else KINDS[declaration.kind]
            opened = await stack.enter_async_context(opener(name, declaration, bench, own))
            if isinstance(declaration, McpServer):
                servers.update({tool.name: name for tool in opened})
            tools += opened
            secrets |= own
        yield Toolbox(bench.stage, tools, secrets, servers)


def _secret_variables(declaration: ToolDeclaration | None) -> list[str]:
    """The variables of the worker's environment a declaration reads (a command tool none:
    secrets never enter a sandbox)."""
    if isinstance(declaration, HostTool | McpServer):
        return list(declaration.secrets.values())
    return []

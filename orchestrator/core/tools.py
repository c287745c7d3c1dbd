"""Tools a pipeline declares beyond the built-in ones: what they are, and what makes one wrong.

A pipeline's `[tools.<name>]` tables declare tools; a stage names the tools its model may call
in its `tools = [...]`, built-in (`BUILTIN_TOOLS`) or declared. Three kinds:

- `host`: a typed Python function by import path, run in the worker process (calls to outside
  services). It receives the arguments the model sends, the `settings`, `secrets` and
  `environment` its declaration binds to its other parameters, for a parameter annotated
  `ToolModel` a client of the stage's model through Baton, and for one annotated `ToolRun` the
  run it serves.
- `command`: a command template run in the stage's sandbox, no shell. Each element of `command`
  and each value of `env` is either literal text (`{{` and `}}` for braces) or exactly one
  `{arg}`: an argument is always one whole argv element or one whole variable, never spliced
  into a string.
- `mcp`: an MCP server (a stdio command on the worker host, or a streamable HTTP URL) whose
  tools named in `tools` (the filter) the stage's model may call.

`orchestrator.core.toolcheck.check_tools(pipeline)` lists every problem of a pipeline's tools;
`load_pipeline` refuses a pipeline that has any, so an enqueue does too. The worker builds the
tools from the same declarations (`workers.tools.declared`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue

BUILTIN_TOOLS = (
    "list_files",
    "search_code",
    "read_file",
    "edit_file",
    "apply_patch",
    "run_tests",
    "show_diff",
    "publish",
)
"""The tools Baton itself has: the code tools, working in the stage's sandbox
(`workers.tools.code`)."""
TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
"""A declared tool's name: what the model calls it by (Gemini allows 64 characters)."""
MCP_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ARGUMENT = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
RUNS_CODE = re.compile(
    r"^(PATH|LD_\w+|PYTHON\w*|BASH_ENV|ENV|IFS|NODE_OPTIONS|PERL5OPT|PERL5LIB|RUBYOPT|GIT_\w+)$"
)
"""Variables whose value decides what code a command runs: the model may not fill them."""


class ToolModel(Protocol):
    """A client of the stage's model, handed to a host tool that declares a parameter annotated
    `ToolModel`. Its calls go through Baton: they wait for the fleet's quota, count in the
    stage's model calls and tokens (the run's accounting, within the stage's model-call
    budget), are audited with the stage's session, and a 429 puts the stage back on its queue
    as the stage's own calls do. The tool's declared secrets are removed from every prompt."""

    async def generate(self, prompt: str, *, system: str = "") -> str:
        """The model's text reply to `prompt` (from an `async def` tool)."""
        ...

    def generate_sync(self, prompt: str, *, system: str = "") -> str:
        """The same from a plain `def` tool, which Baton runs in a thread."""
        ...


class ToolRun(BaseModel):
    """The run a host tool serves, handed to a parameter annotated `ToolRun`: what the run is
    about and where its code is, filled by Baton and never by the model. A tool that acts on an
    outside object (the pull request under review, the issue a run started from) takes it from
    here, so that whatever a prompt talks the model into, the tool acts on the run's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    pipeline: str
    stage: str
    repo: str
    """The repository (a path or URL, any credential in it replaced by `***`)."""
    commit: str
    """The commit the run pinned: for a change, its head."""
    base: str | None = None
    """The commit the change is measured against; None for a run not about a change."""
    source: str
    """Where the run's issue came from (`orchestrator.core.models.IssueSource`)."""
    source_id: str | None = None
    """The issue's id at its source: `owner/repo#number` for GitHub issues and pull requests."""


class _Declaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


EnvName = Annotated[str, Field(pattern=ENV_NAME)]


class HostTool(_Declaration):
    """A typed Python function, run in the worker process."""

    kind: Literal["host"]
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """Import path `module:function`; its module must import on the worker (and where the run
    is enqueued, which checks it)."""
    description: str = ""
    """What the model is told the tool does; empty: the function's docstring."""
    settings: dict[str, JsonValue] = Field(default_factory=dict)
    """Values for parameters of the function the model does not fill, by parameter name."""
    secrets: dict[str, EnvName] = Field(default_factory=dict)
    """Parameters filled from the worker's environment: parameter name = variable name. Their
    values never reach a prompt, a log line or an artifact: they are removed from the tool's
    output and errors."""
    environment: dict[str, EnvName] = Field(default_factory=dict)
    """Parameters (annotated `str`) filled from the worker's environment that are not secret
    and differ per deployment, an API's URL say: parameter name = variable name. A variable
    that is not set, or empty, leaves the parameter's default; a parameter without one then
    fails the stage, naming the variable."""
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """A call still running after this long is answered with an error."""


class CommandArg(_Declaration):
    """One argument a command tool's model fills."""

    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = Field(min_length=1)
    default: str | int | float | bool | None = None
    """The value when the model leaves it out; None: the model must give it."""
    enum: tuple[str | int | float, ...] = ()
    """The only values allowed, when given."""
    pattern: str | None = None
    """A regular expression a string value must match in full."""

    @property
    def python_type(self) -> Any:
        if self.enum:
            return Literal[self.enum]
        return {"string": str, "integer": int, "number": float, "boolean": bool}[self.type]


class CommandTool(_Declaration):
    """A command run in the stage's sandbox, no shell."""

    kind: Literal["command"]
    description: str = Field(min_length=1)
    command: tuple[str, ...] = Field(min_length=1)
    """argv: each element literal text or exactly one `{arg}`; the program is literal."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for the command: each value literal text or exactly one `{arg}`."""
    args: dict[str, CommandArg] = Field(default_factory=dict)
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """The command is killed after this long (and at most half the stage's soft time limit)."""


class McpServer(_Declaration):
    """An MCP server whose tools the stage's model may call, through ADK's `McpToolset`."""

    kind: Literal["mcp"]
    command: tuple[str, ...] = ()
    """A stdio server: the command that starts it on the worker host, with an environment of
    only `env`, `secrets` and the few variables the MCP client passes on (PATH, HOME, …)."""
    url: str = ""
    """A streamable HTTP server: its URL (http or https)."""
    tools: tuple[str, ...] = Field(min_length=1)
    """The server's tools the stage may call (the tool filter); the others are not offered."""
    env: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, EnvName] = Field(default_factory=dict)
    """Values from the worker's environment: for a stdio server, its variable = the worker's
    variable; for an HTTP server, a header = the worker's variable."""
    timeout_s: float = Field(30.0, gt=0, le=600)
    """For the server to start and answer, and for each call."""


ToolDeclaration = Annotated[HostTool | CommandTool | McpServer, Field(discriminator="kind")]


def template_argument(element: str) -> str | None:
    """The argument a template element stands for (`{path}` → `path`); None when literal."""
    match = _ARGUMENT.match(element)
    return match.group(1) if match else None


def literal_text(element: str) -> str:
    """A literal template element as it is passed: `{{` and `}}` stand for braces."""
    return element.replace("{{", "{").replace("}}", "}")

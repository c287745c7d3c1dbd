"""A pipeline written outside Baton's package, as a user would write one: a folder holding its
spec, its schemas module, its host tools and a tiny stdio MCP server (the `mcp` package's own
`MCPServer`). `write_labeller(folder)` writes it; put the folder on `PYTHONPATH` (or `sys.path`)
and name the pipeline by the spec's path. The unit test of a stage and the integration test of
a run both use it, with `LABELLER_SCRIPT` for the fake model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SECRET_VARIABLE = "LABELLER_OWNERS_TOKEN"
SECRET = "owners-secret-7f3a9c2e51d4b8a6"
"""The owners service's token, in the worker's environment: it must show up nowhere."""
QUEUE = "baton.labeller.label"
INJECTIONS = ("$(touch /tmp/x)", "; touch /tmp/y", "`touch /tmp/z`")
"""Shell syntax in arguments of the sandbox tools: each must run nothing."""

SCHEMAS = """
from pydantic import BaseModel, ConfigDict


class Label(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    owner: str
    summary: str
"""

TOOLS = '''
from pydantic import SecretStr

from orchestrator.core.tools import ToolModel


def lookup_owner(path: str, *, token: str, region: str) -> dict[str, str]:
    """The team that owns a file of the repository, from the owners service.

    Args:
        path: File, relative to the repository root.
    """
    # A careless service answer that echoes the credential.
    return {"path": path, "owner": f"payments@{region}", "auth": f"Bearer {token}"}


def service_status(service: str, *, token: SecretStr) -> dict[str, str]:
    """Whether a service is up."""
    raise ConnectionError(f"status service unreachable with token {token.get_secret_value()}")


async def summarize(text: str, model: ToolModel) -> str:
    """A one-line summary of a text, written by the stage's model."""
    return await model.generate(f"Summarize in one line: {text}")
'''

NOTES_SERVER = '''
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def get_note(topic: str) -> str:
    """The team's note on a topic."""
    return f"note on {topic}: refunds are owned by payments"


@server.tool()
def leak_env(name: str) -> str:
    """Not in the stage's filter: the model never sees it."""
    return os.environ.get(name, "")


@server.tool()
def crash(code: int) -> str:
    """Not in the stage's filter either: the server exits, as a crash would."""
    os._exit(code)


if __name__ == "__main__":
    server.run("stdio")
'''

SPEC = '''
name = "labeller"
description = "Labels an error report with the team that owns the failing code."

[tools.lookup_owner]
kind = "host"
function = "labeller_kit.tools:lookup_owner"
settings = {{ region = "eu" }}
secrets = {{ token = "{secret}" }}

[tools.service_status]
kind = "host"
function = "labeller_kit.tools:service_status"
secrets = {{ token = "{secret}" }}

[tools.summarize]
kind = "host"
function = "labeller_kit.tools:summarize"

[tools.grep_repo]
kind = "command"
description = "Search the repository's files for a fixed string."
command = ["grep", "-rnF", "-e", "{{text}}", "--", "."]
args.text = {{ description = "The text to find." }}

[tools.list_dir]
kind = "command"
description = "List a directory's entries, hidden ones too."
command = ["ls", "-a", "--", "{{path}}"]
env = {{ LISTED_BY = "{{who}}" }}
args.path = {{ description = "The directory." }}
args.who = {{ description = "Who asks.", default = "model" }}

[tools.notes]
kind = "mcp"
command = ["{python}", "{server}"]
tools = ["get_note"]

[[stages]]
name = "label"
queue = "{queue}"
output_schema = "labeller_kit.schemas:Label"
tools = ["lookup_owner", "service_status", "summarize", "grep_repo", "list_dir", "notes"]
budget = {{ max_model_calls = 8 }}
instruction = """
Label the error report with the team that owns the failing code.
<<<REPORT
{{issue}}
REPORT>>>
"""
'''


def write_labeller(folder: Path) -> Path:
    """The labeller pipeline in `folder` (its package `labeller_kit`); returns its spec's path."""
    package = folder / "labeller_kit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "schemas.py").write_text(SCHEMAS)
    (package / "tools.py").write_text(TOOLS)
    server = write_notes_server(folder)
    spec = folder / "labeller.toml"
    spec.write_text(SPEC.format(secret=SECRET_VARIABLE, python=sys.executable, server=server,
                                queue=QUEUE))  # fmt: skip
    return spec


def write_notes_server(folder: Path) -> Path:
    """The tiny stdio MCP server, as a script in `folder`."""
    server = folder / "notes_server.py"
    server.write_text(NOTES_SERVER)
    return server


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args}


LABEL = {"label": "bug", "owner": "payments@eu", "summary": "A one-line summary."}
"""The stage's output."""
LABELLER_SCRIPT: dict[str, Any] = {
    "label": [
        {"calls": [call("lookup_owner", path="shopcart/cart.py"),
                   call("service_status", service="owners")]},
        {"calls": [call("grep_repo", text=INJECTIONS[0]),
                   call("list_dir", path=INJECTIONS[1], who=INJECTIONS[2])]},
        {"calls": [call("list_dir", path="/tmp"), call("list_dir", path="."),
                   call("get_note", topic="payments"),
                   call("summarize", text="cart.py fails on an empty cart")]},
        {"json": LABEL},
    ],
    # The summarize tool's own model call: not an ADK agent, so the fake names it `default`.
    "default": [{"text": "A one-line summary."}],
}  # fmt: skip
"""What the fake model says: every tool once, the shell syntax, the listings that show it ran
nothing, then the label."""
TOOL_CALLS = ["lookup_owner", "service_status", "grep_repo", "list_dir", "list_dir", "list_dir",
              "get_note", "summarize"]  # fmt: skip

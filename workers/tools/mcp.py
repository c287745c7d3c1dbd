"""MCP toolsets: an MCP server's tools, through ADK's `McpToolset`, for one stage execution.

The server is a stdio command started on the worker host (its environment only the
declaration's `env` and `secrets` over the few variables the MCP client passes on: none of the
worker's own secrets), or a streamable HTTP URL (`headers` and `secrets` as headers). It is
reached when the stage's tools are built: one that does not start or answer within its
`timeout_s`, or lacks a tool the declaration's filter names, is a `StageError` naming the server,
before the model is called. The stage's model is offered only the tools in the filter.

A server whose connection ends during a call (its process died) ends the stage with a
`StageError` naming it (`McpServers.check_result`). ADK 2.13 answers such a call with
`{"error": "MCP tool execution failed: Connection closed"}` (an ambiguous failure it does not
retry, so a tool with side effects is not run twice) and would start the server again at the
next call; Baton stops instead, since the server's state is gone. The wording is ADK's and the
MCP SDK's, pinned by tests/workers/test_mcp_tools.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.mcp_tool import (
    McpTool,
    McpToolset,
    StdioConnectionParams,
    StreamableHTTPConnectionParams,
)
from mcp import StdioServerParameters

from orchestrator.core.tools import McpServer
from workers.errors import StageError
from workers.tools.secrets import Secrets

logger = logging.getLogger(__name__)

CONNECTION_LOST = ("Connection closed", "Unexpected error during MCP tool execution")
"""What ADK's answer to a call says when the server's connection ended during it (the MCP
SDK's `Connection closed`), or the transport failed outside the protocol."""


@asynccontextmanager
async def mcp_tools(
    name: str, server: McpServer, *, stage: str, secrets: Secrets
) -> AsyncIterator[list[BaseTool]]:
    """The tools of the server `name` that its filter names, for as long as the block runs;
    the server is stopped (or the session closed) afterwards.

    Raises:
        StageError: the server did not start or answer, or lacks a tool of the filter.
    """
    toolset = McpToolset(connection_params=_connection(server, secrets),
                         tool_filter=list(server.tools))  # fmt: skip
    try:
        try:
            tools = await asyncio.wait_for(toolset.get_tools(), timeout=2 * server.timeout_s)
        except Exception as exc:  # ADK's ConnectionError, a timeout, an OSError from the start
            said = secrets.redact(str(exc)) or type(exc).__name__
            raise StageError(
                f"the MCP server {name!r} of stage {stage!r} did not start or answer: {said}"
            ) from None
        missing = [tool for tool in server.tools if tool not in {t.name for t in tools}]
        if missing:
            offered = ", ".join(sorted(t.name for t in tools)) or "none of them"
            raise StageError(
                f"the MCP server {name!r} of stage {stage!r} has no tool {', '.join(missing)} "
                f"that its filter names (of the filter's tools it has: {offered})"
            )
        yield tools
    finally:
        try:
            await toolset.close()
        except Exception:  # the server may be gone already; the stage's result stands
            logger.info("closing the MCP server %s of %s failed", name, stage, exc_info=True)


def lost_connection(tool: BaseTool, response: Any) -> bool:
    """Whether `response`, an MCP tool's answer, says the server's connection ended."""
    if not isinstance(tool, McpTool) or not isinstance(response, dict):
        return False
    error = response.get("error")
    return isinstance(error, str) and any(marker in error for marker in CONNECTION_LOST)


def _connection(
    server: McpServer, secrets: Secrets
) -> StdioConnectionParams | StreamableHTTPConnectionParams:
    given = {key: secrets.value(variable) for key, variable in server.secrets.items()}
    if server.command:
        program, *args = server.command
        return StdioConnectionParams(
            server_params=StdioServerParameters(
                command=program, args=args, env={**server.env, **given}
            ),
            timeout=server.timeout_s,
        )
    return StreamableHTTPConnectionParams(
        url=server.url,
        headers={**server.headers, **given} or None,
        timeout=server.timeout_s,
        sse_read_timeout=server.timeout_s,  # each call's, as a stdio server's read timeout is
    )

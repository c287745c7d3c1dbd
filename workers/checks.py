"""What the orchestrator asks the workers about a pipeline before a run exists, through entry
points of the `baton.checks` group (the orchestrator never imports `workers`): do the tools its
stages name exist here?

`check_tools` knows the built-in code tools only. Declared tools (host functions, sandbox
commands, MCP toolsets) replace it with their own check, under the same entry point and with
the same contract.
"""

from __future__ import annotations

from orchestrator.core.pipeline import Pipeline
from workers.tools.code import TOOL_NAMES


def check_tools(pipeline: Pipeline) -> list[tuple[str, str]]:
    """Each stage that names a tool no worker has, as (stage, message); empty when all resolve."""
    problems = []
    for stage in pipeline.stages:
        unknown = [tool for tool in stage.tools if tool not in TOOL_NAMES]
        if unknown:
            problems.append(
                (
                    stage.name,
                    f"unknown tool {', '.join(map(repr, unknown))}; the tools are "
                    f"{', '.join(TOOL_NAMES)}",
                )
            )
    return problems

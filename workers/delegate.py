"""The `delegate` tool: a stage's agent hands a part of its work to a child agent.

The child runs in this worker process, in a fresh ADK session, while the parent's tool call
awaits it: a stage's children live and die with its execution, within its time limit, its
sandbox and its fence, and the parent reads their summaries in the same turn. (A child as a
Celery task of its own would need the parent to hold its worker slot while it waits, or to
park and be resumed; see docs/pipelines.md.) The child gets its own instruction
(`DelegateRule.instruction`), its own tools (a subset of the stage's, opened afresh), its own
budget, and one user message: the goal, and the paths to look at. It hands back only a
`ChildSummary`, cut to `max_summary_chars`: nothing of its conversation enters the parent's.

Its model calls go through the stage's own model (the fleet's quota and cooldown, a 429 ending
the stage as the stage's own calls do), count in the stage's usage within the stage's model-call
budget, are kept with the stage's requests, and its events go to the run's audit log under its
derived session id and composed branch label (`orchestrator.core.subsessions`).

A delegation the stage may not make (past `max_depth`, with the stage's model calls spent, a
bad name) and a child that ends without a usable summary are tool errors the parent's model
reads; anything else (a 429, a cancelled run) ends the stage as it would without delegation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.sessions import InMemorySessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool

from orchestrator.core.delegation import DELEGATE_TOOL, ChildSummary, DelegateRule
from orchestrator.core.rules import StageBudget
from orchestrator.core.subsessions import SUB, Lineage
from workers import output as outputs
from workers.agent import AgentSpec, AuditSink, StageSession, Usage, build_agent
from workers.errors import ModelCallLimitError, StageOutputError
from workers.subsessions import BRANCH, SESSION, LabellingSessionService
from workers.tools.declared import Toolbox

logger = logging.getLogger(__name__)

REPAIR_MODEL_CALLS = 2
OpenTools = Callable[[Sequence[str]], AbstractAsyncContextManager[Toolbox]]


@dataclass(frozen=True)
class Delegation:
    """What every `delegate` tool of one stage execution shares: the rule, and the stage's
    model, usage, budget, audit and safe points."""

    rule: DelegateRule
    stage: str
    stage_budget: StageBudget
    model: BaseLlm
    usage: Usage
    audit: AuditSink
    open_tools: OpenTools
    """Opens the named tools of the stage (never `delegate`) for one child."""
    checkpoint: Callable[[], None] | None = None
    record_request: Callable[[dict[str, Any]], None] | None = None
    streaming: bool = False
    handoff: Callable[[], None] | None = None
    """Called right before a child starts: the run's budget counts it as a hand-off
    (`orchestrator.core.handoffs`); raises to refuse it, which ends the stage."""

    def remaining_model_calls(self) -> int:
        """The stage's model calls not yet made, by itself or any child."""
        return self.stage_budget.max_model_calls - self.usage.requests


def without_delegate(names: Sequence[str]) -> list[str]:
    """The tool names the toolbox opens: all but the engine's `delegate`."""
    return [name for name in names if name != DELEGATE_TOOL]


def delegate_tool(delegation: Delegation, lineage: Lineage) -> BaseTool:
    """The `delegate` tool of the agent at `lineage`: each call starts one child of it."""
    invocations = 0
    slots = asyncio.Semaphore(delegation.rule.max_children)
    budget = delegation.rule.budget.stage_budget(delegation.stage_budget)

    async def delegate(goal: str, name: str = "", paths: list[str] | None = None) -> dict[str, Any]:
        """Hand a part of your work to a helper agent, which works on it with its own tools
        and returns only a short summary and its findings.

        Args:
            goal: What the helper should find out or do, in a sentence or two.
            name: A short name for the helper: lower-case letters, digits and _ (e.g. "cart").
            paths: Files of the repository the helper should look at first.
        """
        nonlocal invocations
        try:
            child = lineage.child(f"{SUB}_{name}" if name else SUB, invocations + 1)
        except ValueError as exc:  # past max_depth, or a name that cannot be a label
            return {"error": f"delegation refused: {exc}"}
        invocations += 1
        async with slots:
            # ADK reads a limit of 0 as none: a child starts only with calls left to make.
            max_calls = min(budget.max_model_calls, delegation.remaining_model_calls())
            if max_calls <= 0:
                return {"error": "delegation refused: the stage has spent its model calls"}
            if delegation.handoff is not None:
                delegation.handoff()
            try:
                return await _run_child(delegation, child, goal, list(paths or []), max_calls)
            except ModelCallLimitError:
                return {"error": f"the helper {child.label} used its {max_calls} model calls "
                                 "without finishing"}  # fmt: skip
            except StageOutputError as exc:
                return {"error": f"the helper {child.label} ended without a summary: {exc}"}

    return FunctionTool(delegate)


async def _run_child(
    delegation: Delegation, child: Lineage, goal: str, paths: list[str], max_calls: int
) -> dict[str, Any]:
    rule = delegation.rule
    labels = {BRANCH: child.label, SESSION: child.session, "stage": delegation.stage,
              "depth": str(child.depth)}  # fmt: skip
    async with delegation.open_tools(without_delegate(rule.tools)) as toolbox:
        tools: list[BaseTool] = list(toolbox.tools)
        if DELEGATE_TOOL in rule.tools:
            tools.append(delegate_tool(delegation, child))
        budget = rule.budget.stage_budget(delegation.stage_budget)
        agent = build_agent(
            AgentSpec(
                name=child.label.rsplit(".", 1)[-1],
                # Verbatim: braces in the configured text are not placeholders.
                instruction=rule.instruction.replace("{", "{{").replace("}", "}}"),
                contract=outputs.contract(ChildSummary),
                budget=budget,
                tools=tools,
                review_tool_result=toolbox.review,
                json_reply=not tools,
                checkpoint=delegation.checkpoint,
                record_request=delegation.record_request,
            ),
            delegation.model,
            delegation.usage,
        )
        service = LabellingSessionService(InMemorySessionService(), child.label)
        async with StageSession.open(
            agent, session_id=child.session, state={}, audit=delegation.audit, labels=labels,
            usage=delegation.usage, streaming=delegation.streaming, session_service=service,
        ) as session:  # fmt: skip
            text = await session.turn(_message(goal, paths), max_model_calls=max_calls)
            try:
                summary = outputs.parse(text, ChildSummary)
            except StageOutputError as first:
                repair_calls = min(REPAIR_MODEL_CALLS, delegation.remaining_model_calls())
                if repair_calls <= 0:
                    raise
                repair = outputs.repair_message(first)
                text = await session.turn(repair, max_model_calls=repair_calls)
                summary = outputs.parse(text, ChildSummary)
    logger.info("child %s of stage %s: %d findings", child.session, delegation.stage,
                len(summary["findings"]))  # fmt: skip
    return outputs.truncate_to_budget(summary, ChildSummary, rule.budget.max_summary_chars)


def _message(goal: str, paths: list[str]) -> str:
    text = f"Your goal: {goal}"
    if paths:
        text += "\nLook first at: " + ", ".join(paths)
    return text

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

A child asked for with `keep=true` and a name is *kept*: its session outlives the call, stored
with the run (`orchestrator.core.children`), and a later delegation to the same name, by this
stage or a later one of the run, continues its conversation, under the id `<run>:sub:<branch>`.
It still runs only while it is called: "kept" means it lives beyond the call, not that it runs
beside its parent (a model that wants children at work at the same time asks for several in one
reply: ADK runs those calls together, up to `max_children`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.sessions import InMemorySessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool

from orchestrator.core.children import Children, KeptSession
from orchestrator.core.delegation import DELEGATE_TOOL, ChildSummary, DelegateRule
from orchestrator.core.rules import StageBudget
from orchestrator.core.subsessions import Lineage, child_branch
from workers import output as outputs
from workers.agent import AgentSpec, AuditSink, StageSession, Usage, build_agent
from workers.errors import ModelCallLimitError, StageOutputError
from workers.subsessions import (
    BRANCH,
    SESSION,
    LabellingSessionService,
    dump_events,
    load_events,
)
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
    run_id: str = "local"
    """The run, which kept children's ids derive from."""
    children: Children | None = None
    """Where kept children's sessions are kept between calls (the run store's, in a worker);
    None: an execution without a run (a replay), where no child can be kept."""
    handoff: Callable[[], None] | None = None
    """Called right before a child starts: the run's budget counts it as a hand-off
    (`orchestrator.core.handoffs`); raises to refuse it, which ends the stage."""

    def remaining_model_calls(self) -> int:
        """The stage's model calls not yet made, by itself or any child."""
        return self.stage_budget.max_model_calls - self.usage.requests


def without_delegate(names: Sequence[str]) -> list[str]:
    """The tool names the toolbox opens: all but the engine's `delegate`."""
    return [name for name in names if name != DELEGATE_TOOL]


@dataclass
class Invocations:
    """How many delegations one agent's session has made: its next child is number `+1`."""

    count: int = 0


def delegate_tool(
    delegation: Delegation, lineage: Lineage, invocations: Invocations | None = None
) -> BaseTool:
    """The `delegate` tool of the agent at `lineage`: each call starts one child of it."""
    made = invocations or Invocations()
    slots = asyncio.Semaphore(delegation.rule.max_children)
    budget = delegation.rule.budget.stage_budget(delegation.stage_budget)

    async def delegate(
        goal: str, name: str = "", paths: list[str] | None = None, keep: bool = False
    ) -> dict[str, Any]:
        """Hand a part of your work to a helper agent, which works on it with its own tools
        and returns only a short summary and its findings.

        Args:
            goal: What the helper should find out or do, in a sentence or two.
            name: A short name for the helper: lower-case letters, digits and _ (e.g. "cart").
            paths: Files of the repository the helper should look at first.
            keep: Keep the helper for later: a later delegation with the same name, by you or
                by a later stage of the run, continues its conversation. Needs a name.
        """
        try:
            branch = child_branch(name)
            if keep and not name:
                raise ValueError("a kept helper needs a name, to be asked again by it")
            child = (
                lineage.kept(branch, delegation.run_id)
                if keep
                else lineage.child(branch, made.count + 1)
            )
        except ValueError as exc:  # past max_depth, or a name that cannot be a label
            return {"error": f"delegation refused: {exc}"}
        if not keep:
            made.count += 1
        async with slots:
            # ADK reads a limit of 0 as none: a child starts only with calls left to make.
            max_calls = min(budget.max_model_calls, delegation.remaining_model_calls())
            if max_calls <= 0:
                return {"error": "delegation refused: the stage has spent its model calls"}
            if delegation.handoff is not None:
                delegation.handoff()
            try:
                if keep:
                    return await _run_kept(delegation, child, branch, goal, list(paths or []),
                                           max_calls)  # fmt: skip
                summary, _ = await _run_child(delegation, child, goal, list(paths or []),
                                              max_calls, Invocations())  # fmt: skip
                return summary
            except ModelCallLimitError:
                return {"error": f"the helper {child.label} used its {max_calls} model calls "
                                 "without finishing"}  # fmt: skip
            except StageOutputError as exc:
                return {"error": f"the helper {child.label} ended without a summary: {exc}"}

    return FunctionTool(delegate)


async def _run_kept(
    delegation: Delegation, child: Lineage, branch: str, goal: str, paths: list[str],
    max_calls: int,
) -> dict[str, Any]:  # fmt: skip
    """One turn of the kept child `branch`, while this execution holds it: its session restored,
    run, and stored again when the turn ends with a summary. A turn that ends without one leaves
    the history as it was, but not the count of the child's own delegations: the ids of the
    children it started in that turn are in the audit log and are never given again."""
    store, holder = delegation.children, f"{child.session}@{uuid.uuid4().hex}"
    if store is None:
        return {"error": "delegation refused: this execution has no run to keep a helper in; "
                         "delegate without keep"}  # fmt: skip
    if not store.claim(branch, holder, delegation.stage_budget.time_limit_s):
        return {"error": f"the helper {child.label} is busy with another request of this run: "
                         "ask it again later, or ask another helper"}  # fmt: skip
    try:
        kept = store.load(branch)
        made = Invocations(kept.delegations)
        try:
            summary, events = await _run_child(delegation, child, goal, paths, max_calls, made,
                                               history=kept.events)  # fmt: skip
        except BaseException:  # a cancelled stage's too: the ids were given
            if made.count != kept.delegations:
                store.save(branch, KeptSession(kept.events, made.count))
            raise
        store.save(branch, KeptSession(events, made.count))
        return summary
    finally:
        store.release(branch, holder)


async def _run_child(
    delegation: Delegation,
    child: Lineage,
    goal: str,
    paths: list[str],
    max_calls: int,
    made: Invocations,
    *,
    history: list[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Run one turn of a child: a fresh session, or a kept child's restored from its stored
    `history` (`made` counts the delegations of its session). Returns its summary and, for a
    kept child, its session's events as they are to be stored."""
    rule = delegation.rule
    labels = {BRANCH: child.label, SESSION: child.session, "stage": delegation.stage,
              "depth": str(child.depth)}  # fmt: skip
    async with delegation.open_tools(without_delegate(rule.tools)) as toolbox:
        tools: list[BaseTool] = list(toolbox.tools)
        if DELEGATE_TOOL in rule.tools:
            tools.append(delegate_tool(delegation, child, made))
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
        restored = load_events(history or [])
        service = LabellingSessionService(InMemorySessionService(), child.label, restored)
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
            events = await session.events() if history is not None else []
    logger.info("child %s of stage %s: %d findings", child.session, delegation.stage,
                len(summary["findings"]))  # fmt: skip
    summary = outputs.truncate_to_budget(summary, ChildSummary, rule.budget.max_summary_chars)
    return summary, dump_events(events, rule.budget.max_kept_chars)


def _message(goal: str, paths: list[str]) -> str:
    text = f"Your goal: {goal}"
    if paths:
        text += "\nLook first at: " + ", ".join(paths)
    return text

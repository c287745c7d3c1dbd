"""Subagents inside a stage: the `delegate` tool's configuration and what a child returns.

A stage that names `delegate` in its `tools` may hand a part of its work to a child agent: a
fresh ADK session in the same worker process, with its own instruction, tools (a subset of the
stage's) and budget, whose only product the stage's model reads is a compact `ChildSummary`.
The stage's `delegate = {...}` table configures it (`DelegateRule`); the worker side is
`workers.delegate`, the ids and labels of child sessions `workers.subsessions`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.rules import NAME, StageBudget

DELEGATE_TOOL = "delegate"
"""The engine's own tool that starts a child agent; a pipeline may not declare a tool so named."""
MAX_DEPTH = 4
"""The deepest `max_depth` a pipeline may ask for."""
DEFAULT_CHILD_INSTRUCTION = (
    "You are a helper of a pipeline stage. Work only on the goal you are given, with the tools "
    "you have, and report what you found: short, concrete, with file paths and line numbers."
)


class ChildBudget(BaseModel):
    """What one child may spend; its model calls also count in the stage's own budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_model_calls: int = Field(6, gt=0)
    """Model calls of one child (its repair turn included); never more than the stage has left."""
    max_request_tokens: int = Field(8_000, gt=0)
    """The child's outgoing requests are trimmed to about this many tokens."""
    max_tool_output_chars: int = Field(4_000, gt=0)
    """A tool result of the child longer than this is cut, with a marker."""
    max_summary_chars: int = Field(2_000, gt=0)
    """The child's summary (as JSON) is cut to this before the stage's model reads it."""
    max_kept_chars: int = Field(100_000, gt=0)
    """A kept child's stored history (`keep=true`): its oldest turns are dropped past this
    many characters of events; its latest turn is always kept."""

    def stage_budget(self, stage: StageBudget) -> StageBudget:
        """The child's limits in the shape an agent is built from (time limits: the stage's)."""
        return stage.model_copy(
            update={
                "max_model_calls": self.max_model_calls,
                "max_request_tokens": self.max_request_tokens,
                "max_tool_output_chars": self.max_tool_output_chars,
                "max_output_chars": self.max_summary_chars,
            }
        )


class DelegateRule(BaseModel):
    """A stage's `delegate = { ... }`: how deep, how many at once, with what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_depth: int = Field(2, ge=1, le=MAX_DEPTH)
    """How deep delegation may go: the stage's children are at depth 1, theirs at 2; a
    delegation that would start a child deeper than this is refused (a tool error)."""
    max_children: int = Field(3, ge=1, le=16)
    """Children of one agent running at the same time; a further delegation waits."""
    tools: tuple[str, ...] = ()
    """The tools a child may call: a subset of the stage's. `delegate` among them lets a child
    delegate in turn, down to `max_depth`."""
    budget: ChildBudget = ChildBudget()
    instruction: str = Field(DEFAULT_CHILD_INSTRUCTION, min_length=1)
    """What every child is told before its goal (verbatim: no placeholders)."""

    def problems(self, stage: str, stage_tools: tuple[str, ...]) -> list[str]:
        """What is wrong with this rule on a stage with `stage_tools`."""
        found = []
        if DELEGATE_TOOL not in stage_tools:
            found.append(f"stage {stage!r} has a `delegate` table but no `delegate` in its tools")
        extra = [name for name in self.tools if name not in stage_tools]
        if extra:
            found.append(
                f"stage {stage!r}: delegate.tools {extra} are not among the stage's tools "
                f"{list(stage_tools)}; a child's tools are a subset of its stage's"
            )
        return found


class Finding(BaseModel):
    """One thing a child found."""

    model_config = ConfigDict(extra="forbid")

    note: str
    path: str = ""
    """The file it concerns, relative to the repository root; empty: none."""
    line: int | None = None


class ChildSummary(BaseModel):
    """All a child hands back to the agent that delegated to it."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(description="What the child did and concluded, in a few sentences.")
    findings: list[Finding] = Field(default_factory=list)


CHILD_NAME = f"^{NAME}$"
"""A child's name, as the delegating model gives it: it becomes a segment of a branch label
(`.`-separated) and of a session id (`:`-separated), so it holds neither."""

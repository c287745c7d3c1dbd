"""One stage execution as one fresh ADK session.

A new `Runner` and `InMemorySessionService` per execution: the agent sees its instruction
(rendered by Baton, never by ADK's `{key}` templating), one user message, and its own tool
calls in this turn. Nothing of any other stage.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.agents.invocation_context import LlmCallsLimitExceededError
from google.adk.agents.readonly_context import ReadonlyContext
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.events import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.telemetry.context import ContentCapturingMode, TelemetryConfig
from google.adk.tools.base_tool import BaseTool
from google.genai import types

from orchestrator.core.pipeline import render
from orchestrator.core.rules import CompactionRule, StageBudget
from workers.budget import request_trimmer, tool_output_limiter
from workers.compaction import Compactor
from workers.errors import ModelCallLimitError
from workers.guard import ToolGuard
from workers.subsessions import BRANCH

logger = logging.getLogger(__name__)

APP_NAME = "baton"


@functools.cache
def _telemetry() -> TelemetryConfig:
    """One telemetry configuration for every run of this process: ADK builds a new one, reading
    its environment variables, at every step of a run that gives none. Message contents are not
    put on spans: a prompt holds issue text and code, which belong to the run store only."""
    return TelemetryConfig(capture_message_content=ContentCapturingMode.NO_CONTENT)


def _skip_absent_a2a() -> None:
    """ADK imports `RemoteA2aAgent` each time it builds a run's node, to recognise one; without
    the `a2a` package that import fails after running half the module again, every time, for
    every stage. Baton runs no A2A agents: when `a2a` is absent, the module is marked
    missing, so the import fails at once. Where `a2a` is installed nothing changes."""
    if importlib.util.find_spec("a2a") is None:
        sys.modules.setdefault("google.adk.agents.remote_a2a_agent", None)  # type: ignore[arg-type]


_skip_absent_a2a()

AuditSink = Callable[[list[dict[str, Any]]], None]


@dataclass
class Usage:
    """Model calls and tokens of one stage execution, counted from non-partial events."""

    requests: int = 0
    prompt_tokens_total: int = 0
    prompt_tokens_max: int = 0
    output_tokens: int = 0

    def add_event(self, event: LlmResponse) -> None:
        usage = event.usage_metadata
        if usage is None or event.partial:
            return
        prompt = usage.prompt_token_count or 0
        self.prompt_tokens_total += prompt
        self.prompt_tokens_max = max(self.prompt_tokens_max, prompt)
        # Thinking is billed as output: a Gemini 3 reply's thoughts count with its candidates.
        self.output_tokens += (usage.candidates_token_count or 0) + (
            usage.thoughts_token_count or 0
        )


REQUEST_FIELDS = {"model", "contents", "config"}
"""What of an `LlmRequest` is kept when requests are recorded: what goes on the wire."""


@dataclass
class AgentSpec:
    """What to build one stage's agent from."""

    name: str
    instruction: str
    """Template with `{key}` placeholders, rendered from session state by Baton."""
    contract: str
    """Appended verbatim after the rendered instruction: how to reply."""
    budget: StageBudget
    tools: Sequence[Callable[..., Any] | BaseTool] = ()
    """Functions (ADK makes each a `FunctionTool`) or ADK tools (`workers.tools.declared`)."""
    review_tool_result: Callable[[BaseTool, Any], dict[str, Any]] | None = None
    """What every tool result passes before the output budget (`Toolbox.review`); it may
    raise to end the stage."""
    json_reply: bool = False
    """Ask the API for `application/json` (only for stages without tools)."""
    checkpoint: Callable[[], None] | None = None
    """Called before every model and tool call: the stage's safe points (it raises to stop)."""
    record_request: Callable[[dict[str, Any]], None] | None = None
    """Given every model request as it is sent (after trimming), as JSON-ready data."""
    compaction: CompactionRule | None = None
    """Summarise the older part of a long history (`workers.compaction`); None: trim only."""
    summarizer: BaseLlm | None = None
    """The model that writes those summaries; None: the stage's own."""
    audit: AuditSink | None = None
    """Where Baton's own entries about the session (a compaction's) go, labelled."""


def build_agent(spec: AgentSpec, model: BaseLlm, usage: Usage) -> LlmAgent:
    """The stage's agent, held to its own tools by a fresh `ToolGuard`: build one per
    execution, so that its one repair turn for a bad tool call is never shared."""

    def instruction(ctx: ReadonlyContext) -> str:
        return render(spec.instruction, dict(ctx.state)).strip() + "\n\n" + spec.contract

    def safe_point(*_: Any, **__: Any) -> None:
        if spec.checkpoint is not None:
            spec.checkpoint()

    def sent(llm_request: LlmRequest, agent: str) -> None:
        """Count a model request of the stage and record it as it goes out."""
        usage.requests += 1
        if spec.record_request is not None:
            dumped = llm_request.model_dump(mode="json", include=REQUEST_FIELDS, exclude_none=True)
            spec.record_request({"agent": agent, "number": usage.requests, **dumped})

    async def before_model(callback_context: Any, llm_request: LlmRequest) -> LlmResponse | None:
        """The safe point, compaction, the trim, then the count of what is sent: one callback
        rather than a list, as ADK inspects each callback's signature at every call."""
        safe_point()
        if compact is not None:
            await compact(callback_context, llm_request)
        trimmed = trim(callback_context, llm_request)
        if trimmed is not None:
            return trimmed
        sent(llm_request, spec.name)
        return None

    config = (
        types.GenerateContentConfig(response_mime_type="application/json")
        if spec.json_reply
        else None
    )
    trim = request_trimmer(spec.budget.max_request_tokens)
    compact = (
        Compactor(
            spec.compaction,
            stage=spec.name,
            budget_tokens=spec.budget.max_request_tokens,
            model=spec.summarizer or model,
            usage=usage,
            checkpoint=safe_point,
            sent=sent,
            audit=spec.audit,
        )
        if spec.compaction is not None
        else None
    )
    guard = ToolGuard([_tool_name(tool) for tool in spec.tools], stage=spec.name)
    return LlmAgent(
        name=spec.name,
        model=model,
        instruction=instruction,
        tools=list(spec.tools),
        generate_content_config=config,
        before_model_callback=before_model,
        after_model_callback=guard.after_model,
        before_tool_callback=[safe_point, guard.before_tool],
        after_tool_callback=_after_tool(spec),
    )


def _after_tool(spec: AgentSpec) -> Callable[..., dict[str, Any] | None]:
    """The review, then the budget: one callback, as ADK stops at the first that answers."""
    limit = tool_output_limiter(spec.budget.max_tool_output_chars)

    def after_tool(
        tool: BaseTool, args: dict[str, Any], tool_context: Any, tool_response: Any
    ) -> dict[str, Any] | None:
        if spec.review_tool_result is None:
            return limit(tool, args, tool_context, tool_response)
        reviewed = spec.review_tool_result(tool, tool_response)
        return limit(tool, args, tool_context, reviewed) or reviewed

    return after_tool


def _tool_name(tool: Callable[..., Any] | BaseTool) -> str:
    return tool.name if isinstance(tool, BaseTool) else tool.__name__


class StageSession:
    """A fresh session over one agent; `turn()` sends one user message and returns the reply."""

    def __init__(
        self,
        runner: Runner,
        session_id: str,
        *,
        audit: AuditSink,
        labels: Mapping[str, str],
        usage: Usage,
        streaming: bool,
    ) -> None:
        self._runner = runner
        self._session_id = session_id
        self._audit = audit
        self._labels = dict(labels)
        self.usage = usage
        self._streaming = streaming

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        agent: LlmAgent,
        *,
        session_id: str,
        state: Mapping[str, Any],
        audit: AuditSink,
        labels: Mapping[str, str],
        usage: Usage,
        streaming: bool = False,
        session_service: BaseSessionService | None = None,
    ) -> AsyncIterator[StageSession]:
        """A fresh session of `agent`, stored by `session_service` (a new in-memory one by
        default; a child's stamps its branch label, `workers.subsessions`)."""
        service = session_service or InMemorySessionService()
        runner = Runner(agent=agent, app_name=APP_NAME, session_service=service)
        try:
            await runner.session_service.create_session(
                app_name=APP_NAME, user_id=session_id, session_id=session_id, state=dict(state)
            )
            yield cls(
                runner, session_id, audit=audit, labels=labels, usage=usage, streaming=streaming
            )
        finally:
            await runner.close()

    async def turn(self, message: str, *, max_model_calls: int) -> str:
        """Run one invocation; returns the final reply text (may be empty).

        Raises:
            ModelCallLimitError: the invocation reached `max_model_calls`.
        """
        run_config = RunConfig(
            max_llm_calls=max_model_calls,
            streaming_mode=StreamingMode.SSE if self._streaming else StreamingMode.NONE,
            telemetry=_telemetry(),
        )
        content = types.Content(role="user", parts=[types.Part(text=message)])
        # The user message is written with the first event, in one round trip.
        pending: list[dict[str, Any]] = [
            {
                **self._labels,
                "ts": repr(time.time()),
                "kind": "user_message",
                "author": "user",
                "data": json.dumps({"text": message}),
            }
        ]
        final = ""
        try:
            async for event in self._runner.run_async(
                user_id=self._session_id,
                session_id=self._session_id,
                new_message=content,
                run_config=run_config,
            ):
                self.usage.add_event(event)
                if not event.partial:
                    self._audit([*pending, self._audit_entry(event)])
                    pending = []
                if event.is_final_response() and event.content and not event.partial:
                    final = "".join(
                        p.text or "" for p in event.content.parts or [] if not p.thought
                    )
        except LlmCallsLimitExceededError as exc:
            raise ModelCallLimitError(
                f"stage {self._labels.get('stage', '?')!r} reached its budget of {max_model_calls} "
                "model calls without finishing"
            ) from exc
        finally:
            if pending:  # no event came: the message is on record all the same
                self._audit(pending)
        return final

    async def events(self) -> list[Event]:
        """The events the session holds now, oldest first (a kept child's, to be stored)."""
        session = await self._runner.session_service.get_session(
            app_name=APP_NAME, user_id=self._session_id, session_id=self._session_id
        )
        return list(session.events) if session else []

    def _audit_entry(self, event: Event) -> dict[str, Any]:
        content = (
            event.content.model_dump(mode="json", exclude_none=True) if event.content else None
        )
        usage = event.usage_metadata.model_dump(exclude_none=True) if event.usage_metadata else None
        return {
            **self._labels,
            # The label the session's service stored the event with, where it set one.
            **({BRANCH: event.branch} if event.branch else {}),
            "ts": repr(time.time()),
            "kind": _event_kind(event),
            "author": event.author,
            "event_id": event.id,
            "invocation": event.invocation_id,
            "data": json.dumps(
                {"content": content, "usage": usage, "error": event.error_message}, default=str
            ),
        }


def _event_kind(event: Event) -> str:
    parts = event.content.parts if event.content and event.content.parts else []
    if event.error_code:
        return "error"
    if any(p.function_call for p in parts):
        return "tool_call"
    if any(p.function_response for p in parts):
        return "tool_result"
    if event.author == "user":
        return "user_message"
    return "model_reply" if parts else "event"

"""A host tool's model: the stage's own model client, handed to a tool that asks for one.

A host tool that needs a model (to summarise what an outside service returned, say) declares a
parameter annotated `orchestrator.core.tools.ToolModel` and gets a `StageToolModel`. Its calls go
through the same `BatonGemini` as the stage's own: they wait for the fleet's quota and cooldown,
count in the stage's `Usage` (so in the run's requests and tokens) within the stage's model-call
budget, are written to the audit log under the stage's session (the request as
`tool_model_request`, the reply as a `model_reply` whose author is the tool) and kept with the
requests when those are kept. A 429 or a refused request ends the tool call as it ends the
stage's own (`workers.gemini.model_error`): the stage goes back on its queue after the server's
delay, or fails. The tool's declared secrets are removed from every prompt first.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from workers.agent import REQUEST_FIELDS, AuditSink, Usage
from workers.gemini import model_error
from workers.tools.errors import ToolError
from workers.tools.secrets import Secrets


class StageToolModel:
    """`ToolModel` for the tool `tool` of one stage execution."""

    def __init__(
        self,
        tool: str,
        *,
        model: BaseLlm,
        usage: Usage,
        max_model_calls: int,
        audit: AuditSink,
        labels: Mapping[str, str],
        secrets: Secrets,
        loop: asyncio.AbstractEventLoop,
        checkpoint: Callable[[], None] | None = None,
        record_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.tool = tool
        self._model, self._usage, self._max_model_calls = model, usage, max_model_calls
        self._audit, self._labels, self._secrets = audit, dict(labels), secrets
        self._loop, self._checkpoint, self._record = loop, checkpoint, record_request
        self._loop_thread = threading.get_ident()

    async def generate(self, prompt: str, *, system: str = "") -> str:
        """The model's text reply to `prompt`.

        Raises:
            ToolError: the stage's model-call budget is spent (the tool's error for the model).
            ExecutionError: the model call failed as a stage's own call would (a 429, say).
        """
        if self._usage.requests >= self._max_model_calls:
            raise ToolError(
                f"the stage has made the {self._max_model_calls} model calls its budget allows; "
                f"{self.tool} cannot make another"
            )
        if self._checkpoint is not None:
            self._checkpoint()
        request = LlmRequest(
            model=self._model.model,
            contents=[
                types.Content(role="user", parts=[types.Part(text=self._secrets.redact(prompt))])
            ],
            config=types.GenerateContentConfig(
                system_instruction=self._secrets.redact(system) or None,
                # A tool's model call is one request: the client never calls functions itself.
                automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            ),
        )
        self._usage.requests += 1
        sent = request.model_dump(mode="json", include=REQUEST_FIELDS, exclude_none=True)
        if self._record is not None:
            self._record({"agent": self.tool, "number": self._usage.requests, **sent})
        self._entry("tool_model_request", {"content": sent["contents"][0]})
        reply = await self._call(request)
        content = (
            reply.content.model_dump(mode="json", exclude_none=True) if reply.content else None
        )
        usage = reply.usage_metadata.model_dump(exclude_none=True) if reply.usage_metadata else None
        self._entry("model_reply", {"content": content, "usage": usage, "error": None})
        parts = (reply.content.parts or []) if reply.content else []
        return "".join(part.text or "" for part in parts if not part.thought)

    def generate_sync(self, prompt: str, *, system: str = "") -> str:
        """`generate` from a plain `def` tool, which runs in a thread of its own."""
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("generate_sync blocks: an async tool awaits generate() instead")
        future = asyncio.run_coroutine_threadsafe(self.generate(prompt, system=system), self._loop)
        return future.result()

    async def _call(self, request: LlmRequest) -> LlmResponse:
        final: LlmResponse | None = None
        try:
            async for response in self._model.generate_content_async(request):
                self._usage.add_event(response)
                if not response.partial:
                    final = response
        except Exception as exc:  # the model client's errors, made into the stage's
            mapped = model_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        if final is None:
            raise ToolError("the model sent no reply")
        return final

    def _entry(self, kind: str, data: dict[str, Any]) -> None:
        self._audit([{
            **self._labels, "ts": repr(time.time()), "kind": kind, "author": self.tool,
            "data": json.dumps(data, default=str),
        }])  # fmt: skip

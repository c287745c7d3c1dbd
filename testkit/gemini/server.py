"""The fake Gemini REST server: a Starlette app that plays a `Scenario`.

Model endpoints, as google-genai calls them with `base_url` set:

    POST /{version}/models/{model}:generateContent
    POST /{version}/models/{model}:streamGenerateContent?alt=sse

A streamed text reply comes in at least two chunks, each with `usageMetadata` counting the reply
so far, the last with `finishReason`; a function-call reply comes in one chunk.

Admin endpoints, for tests and the demo:

    GET  /_fake/health     {"status": "ok"}
    GET  /_fake/requests   the recorded entries (see `ledger`), oldest first
    POST /_fake/reset      forget recorded entries, restart the request counters, empty the
                           quota windows
    PUT  /_fake/faults     replace the fault rules (body: a list of rules)
    PUT  /_fake/scenario   replace the scenario, its fault rules and quota included

Request headers are never recorded or echoed; the API key arrives in `x-goog-api-key`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from testkit.gemini import tokens, wire
from testkit.gemini.faults import FaultBook
from testkit.gemini.ledger import Ledger
from testkit.gemini.quota import Answered, QuotaBook
from testkit.gemini.scenario import FaultRule, Scenario
from workers.budget import TRIM_NOTE

logger = logging.getLogger(__name__)

LEFT_OUT = re.compile(re.escape(TRIM_NOTE.split("{turns}")[0]) + r"(\d+)")
"""The count of model turns in Baton's trimming note (`workers.budget.TRIM_NOTE`)."""
FUNCTION_REF = re.compile(r"\{\{fn:(\w+)\.(\w+)\}\}")
"""`{{fn:NAME.FIELD}}` in a scripted text: a field of a function response in the request."""

AGENT_NAME = re.compile(r'You are an agent\. Your internal name is "([^"]+)"\.')
"""What ADK appends to every agent's system instruction."""
AGENT_HEADER = "x-baton-agent"
"""Header naming the agent when the system instruction does not."""
DEFAULT_AGENT = "default"
"""The agent of a request that names none."""
STREAM_CHUNK_CHARS = 200
"""Largest piece of text in one streamed chunk."""

_RULES = TypeAdapter(list[FaultRule])


class _Answer(NamedTuple):
    response: Response
    status: int
    candidates_tokens: int = 0


class _DroppedResponse(Response):
    """Promises a body, sends none and ends: the server closes the connection mid-reply, and
    the client sees the reply cut off (`httpx.RemoteProtocolError`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"1024")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})


class FakeServer:
    """The server's state (scenario, fault counters, record) and its endpoints."""

    def __init__(self, scenario: Scenario, ledger: Ledger) -> None:
        self._scenario = scenario
        self._faults = FaultBook(scenario.faults)
        self._quota = QuotaBook(scenario.quota)
        self._ledger = ledger

    async def model_call(self, request: Request) -> Response:
        """Answer `generateContent` or `streamGenerateContent` for one model."""
        model, _, method = request.path_params["target"].rpartition(":")
        if method not in ("generateContent", "streamGenerateContent"):
            return _error(404, f"fake-gemini serves no method {method!r}")
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "Invalid JSON payload received: expected a JSON object.")

        received_s = time.time()
        agent = agent_name(body, request.headers)
        step = model_turns(body)
        stream = method == "streamGenerateContent"
        prompt = tokens.prompt_tokens(body)
        admitted = self._quota.admit(model, received_s, prompt)
        if isinstance(admitted, Answered):
            number, rule = self._faults.next_request(agent)
            await asyncio.sleep(self._latency_ms(rule) / 1000)
            answer = self._answer(rule, agent, model, (step, body), stream, prompt)
            self._quota.settle(model, admitted, answer.status, prompt + answer.candidates_tokens)
        else:
            number, answer = 0, _Answer(_over_quota(admitted), status=429)
        self._ledger.append(
            {
                "ts": received_s,
                "replied": time.time(),
                "agent": agent,
                "model": model,
                "stream": stream,
                "step": step,
                "status": answer.status,
                "prompt_tokens": prompt,
                "candidates_tokens": answer.candidates_tokens,
                "request_chars": len(tokens.compact_json(body)),
                "request": body,
            }
        )
        logger.info(
            "agent=%s request=%d step=%d status=%d prompt_tokens=%d candidates_tokens=%d",
            agent,
            number,
            step,
            answer.status,
            prompt,
            answer.candidates_tokens,
        )
        return answer.response

    def _latency_ms(self, rule: FaultRule | None) -> int:
        if rule is not None and rule.latency_ms is not None:
            return rule.latency_ms
        return self._scenario.latency_ms

    def _answer(
        self,
        rule: FaultRule | None,
        agent: str,
        model: str,
        request: tuple[int, Mapping[str, Any]],
        stream: bool,
        prompt: int,
    ) -> _Answer:
        if rule is not None and rule.drop:
            return _Answer(_DroppedResponse(), status=0)
        if rule is not None and rule.status is not None:
            return _Answer(_fault(rule.status, rule), status=rule.status)
        script = self._scenario.script_for(agent)
        if script is None:
            message = (
                f'fake-gemini: the scenario has no script for agent "{agent}" and no "*" script'
            )
            return _Answer(_error(400, message), status=400)
        step, body = request
        parts = fill_references(script.step(step).parts(), body)
        candidates = tokens.count(parts)
        if stream:
            events = stream_events(parts, model, prompt)
            response: Response = StreamingResponse(_emit(events), media_type="text/event-stream")
        else:
            response = JSONResponse(wire.reply(parts, model, wire.usage(prompt, candidates)))
        return _Answer(response, status=200, candidates_tokens=candidates)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def requests(self, request: Request) -> Response:
        return JSONResponse(self._ledger.entries())

    async def reset(self, request: Request) -> Response:
        self._ledger.clear()
        self._faults.reset()
        self._quota.reset()
        return JSONResponse({"status": "ok"})

    async def set_faults(self, request: Request) -> Response:
        try:
            rules = _RULES.validate_json(await request.body())
        except ValidationError as exc:
            return Response(exc.json(include_url=False), 422, media_type="application/json")
        self._faults.replace(rules)
        return JSONResponse({"status": "ok", "faults": len(rules)})

    async def set_scenario(self, request: Request) -> Response:
        try:
            scenario = Scenario.model_validate_json(await request.body())
        except ValidationError as exc:
            return Response(exc.json(include_url=False), 422, media_type="application/json")
        self._scenario = scenario
        self._faults.replace(scenario.faults)
        self._quota.replace(scenario.quota)
        return JSONResponse({"status": "ok", "agents": sorted(scenario.agents)})


def create_app(scenario: Scenario, record_path: str | Path | None = None) -> Starlette:
    """The fake server as an ASGI app; `record_path` also appends each entry to a JSONL file."""
    server = FakeServer(scenario, Ledger(record_path))
    routes = [
        Route("/{version}/models/{target}", server.model_call, methods=["POST"]),
        Route("/_fake/health", server.health, methods=["GET"]),
        Route("/_fake/requests", server.requests, methods=["GET"]),
        Route("/_fake/reset", server.reset, methods=["POST"]),
        Route("/_fake/faults", server.set_faults, methods=["PUT"]),
        Route("/_fake/scenario", server.set_scenario, methods=["PUT"]),
    ]
    return Starlette(routes=routes)


def agent_name(body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The agent ADK named in the system instruction, else the `x-baton-agent` header, else
    `"default"`."""
    system = body.get("systemInstruction")
    parts = system.get("parts", []) if isinstance(system, dict) else []
    text = "\n".join(part.get("text") or "" for part in parts if isinstance(part, dict))
    names = AGENT_NAME.findall(text)
    if names:
        return str(names[-1])
    return headers.get(AGENT_HEADER) or DEFAULT_AGENT


def model_turns(body: Mapping[str, Any]) -> int:
    """How many replies of the model the conversation holds: the step it is at.

    A request Baton trimmed says in its first content how many model turns it left out; they
    count too, so a trimmed conversation moves on instead of replaying its first steps.
    """
    contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
    seen = sum(1 for content in contents if content.get("role") == "model")
    first = contents[0].get("parts") or [] if contents else []
    texts = " ".join(p.get("text") or "" for p in first if isinstance(p, dict))
    left_out = sum(int(n) for n in LEFT_OUT.findall(texts))
    return seen + left_out


def fill_references(parts: list[dict[str, Any]], body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Replace `{{fn:NAME.FIELD}}` in text parts with FIELD of the newest response of function
    NAME in the request, so a script can repeat what a tool returned (a commit sha, say)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for content in body.get("contents") or []:
        for part in content.get("parts") or [] if isinstance(content, dict) else []:
            response = part.get("functionResponse") if isinstance(part, dict) else None
            if isinstance(response, dict) and isinstance(response.get("response"), dict):
                latest[str(response.get("name"))] = response["response"]

    def value(match: re.Match[str]) -> str:
        name, field = match.group(1), match.group(2)
        found = latest.get(name, {}).get(field)
        text = f"<no {name}.{field} in the request>" if found is None else str(found)
        return json.dumps(text)[1:-1]

    return [
        {**part, "text": FUNCTION_REF.sub(value, part["text"])} if "text" in part else part
        for part in parts
    ]


def stream_events(parts: list[dict[str, Any]], model: str, prompt: int) -> list[bytes]:
    """The SSE events of a streamed reply."""
    if len(parts) != 1 or set(parts[0]) != {"text"}:
        usage = wire.usage(prompt, tokens.count(parts))
        return [wire.sse_event(wire.reply(parts, model, usage))]
    pieces = split_text(parts[0]["text"])
    events = []
    for index, piece in enumerate(pieces):
        so_far = "".join(pieces[: index + 1])
        usage = wire.usage(prompt, tokens.count([{"text": so_far}]))
        final = index == len(pieces) - 1
        events.append(wire.sse_event(wire.reply([{"text": piece}], model, usage, final=final)))
    return events


def split_text(text: str) -> list[str]:
    """`text` in at least two pieces of at most `STREAM_CHUNK_CHARS` (the last may be empty)."""
    count = max(2, math.ceil(len(text) / STREAM_CHUNK_CHARS))
    size = max(1, math.ceil(len(text) / count))
    pieces = [text[start : start + size] for start in range(0, len(text), size)]
    return pieces + [""] * (2 - len(pieces))


async def _emit(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def _fault(status: int, rule: FaultRule) -> Response:
    retry_delay_s = rule.retry_delay_s if status == 429 else None
    headers = {}
    if rule.retry_after_s is not None:
        headers["retry-after"] = str(math.ceil(rule.retry_after_s))
    body = wire.error(status, retry_delay_s=retry_delay_s)
    return Response(body, status, headers=headers, media_type="application/json")


def _over_quota(retry_delay_s: float) -> Response:
    message = "Resource has been exhausted (e.g. check quota): the model's quota is used up."
    body = wire.error(429, message, retry_delay_s=retry_delay_s)
    return Response(body, 429, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return Response(wire.error(status, message), status, media_type="application/json")

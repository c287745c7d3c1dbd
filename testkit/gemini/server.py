"""The fake Gemini REST server: a Starlette app that plays a `Scenario`.

Model endpoints, as google-genai calls them with `base_url` set:

    POST /{version}/models/{model}:generateContent
    POST /{version}/models/{model}:streamGenerateContent?alt=sse

A request is answered in this order: its thought signatures are checked (`signatures`; a 400
when the current turn's are missing or corrupted), the model's quota admits it or refuses it
with a 429 (`quota`), the fault rules may inject a fault (`faults`), and then the agent's
script plays the request's step (`scenario`) as a reply whose shape `wire` describes, signed
and counted as `tokens` says. A streamed text reply comes in at least two chunks; any other
reply in one.

Admin endpoints, for tests and the demo:

    GET  /_fake/health     {"status": "ok"}
    GET  /_fake/requests   the recorded entries (see `ledger`), oldest first
    POST /_fake/reset      forget recorded entries, restart the request counters, empty the
                           quota windows and the implicit cache
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
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from testkit.control import FakeControl
from testkit.gemini import tokens, wire
from testkit.gemini.cache import PrefixCache
from testkit.gemini.faults import FaultBook
from testkit.gemini.ledger import Ledger
from testkit.gemini.quota import Answered, QuotaBook
from testkit.gemini.scenario import FaultRule, Scenario, Step
from testkit.gemini.signatures import Signer

logger = logging.getLogger(__name__)

FUNCTION_REF = re.compile(r"\{\{fn:(\w+)\.(\w+)\}\}")
"""`{{fn:NAME.FIELD}}` in a scripted text: a field of a function response in the request."""

AGENT_NAME = re.compile(r'You are an agent\. Your internal name is "([^"]+)"\.')
"""What ADK appends to every agent's system instruction."""
AGENT_HEADER = "x-baton-agent"
"""Header naming the agent when the system instruction does not."""
DEFAULT_AGENT = "default"
"""The agent of a request that names none."""
SECRET_BYTES = 32
"""Length of the secret each server signs with, drawn when it is created."""

_RULES = TypeAdapter(list[FaultRule])


class _Answer(NamedTuple):
    response: Response
    status: int
    usage: tokens.Usage


class _Request(NamedTuple):
    """What the server made of one model request."""

    body: Mapping[str, Any]
    model: str
    agent: str
    step: int
    stream: bool
    prompt_tokens: int


class _DroppedResponse(Response):
    """Promises a body, sends none and ends: the server closes the connection mid-reply, and
    the client sees the reply cut off (`httpx.RemoteProtocolError`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"1024")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})


class FakeServer(FakeControl[Scenario, FaultRule]):
    """The server's state (scenario, fault counters, quota windows, record, signing secret,
    implicit cache) and its endpoints. `clock` tells the time in seconds since the epoch: when
    requests arrive and are answered, for the record and the quota windows."""

    _scenario_type = Scenario
    _fault_rules = _RULES

    def __init__(
        self,
        scenario: Scenario,
        ledger: Ledger,
        secret: bytes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._scenario = scenario
        self._faults = FaultBook(scenario.faults)
        self._quota = QuotaBook(scenario.quota)
        self._ledger = ledger
        self._signer = Signer(secret)
        self._cache = PrefixCache()

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

        received_s = self._clock()
        asked = self._read(body, model, agent_name(body, request.headers), method)
        number, answer = await self._respond(asked, received_s)
        usage = answer.usage
        self._ledger.append(
            {
                "ts": received_s,
                "replied": self._clock(),
                "agent": asked.agent,
                "model": model,
                "stream": asked.stream,
                "step": asked.step,
                "status": answer.status,
                "prompt_tokens": usage.prompt,
                "candidates_tokens": usage.candidates,
                "thoughts_tokens": usage.thoughts,
                "cached_tokens": usage.cached,
                "request_chars": len(tokens.compact_json(body)),
                "request": body,
            }
        )
        logger.info(
            "agent=%s request=%d step=%d status=%d prompt_tokens=%d candidates_tokens=%d "
            "thoughts_tokens=%d cached_tokens=%d",
            asked.agent, number, asked.step, answer.status, usage.prompt, usage.candidates,
            usage.thoughts, usage.cached,
        )  # fmt: skip
        return answer.response

    def _read(self, body: Mapping[str, Any], model: str, agent: str, method: str) -> _Request:
        step = self._signer.step_of(body, model=model, agent=agent)
        stream = method == "streamGenerateContent"
        return _Request(body, model, agent, step, stream, tokens.prompt_tokens(body))

    async def _respond(self, asked: _Request, received_s: float) -> tuple[int, _Answer]:
        """The request's number among its agent's (0 when it never reached the fault rules)
        and its answer."""
        unanswered = tokens.Usage(asked.prompt_tokens)
        if self._scenario.thought_signatures == "required":
            problem = self._signer.problem(asked.body, model=asked.model, agent=asked.agent)
            if problem is not None:
                return 0, _Answer(_error(400, problem), 400, unanswered)
        admitted = self._quota.admit(asked.model, received_s, asked.prompt_tokens)
        if not isinstance(admitted, Answered):
            return 0, _Answer(_over_quota(admitted), 429, unanswered)
        number, rule = self._faults.next_request(asked.agent)
        await asyncio.sleep(self._latency_ms(rule) / 1000)
        answer = self._answer(rule, asked)
        used = answer.usage.prompt + answer.usage.candidates
        self._quota.settle(asked.model, admitted, answer.status, used)
        if answer.status == 200:
            self._cache.remember(asked.model, asked.agent, asked.body)
        return number, answer

    def _latency_ms(self, rule: FaultRule | None) -> int:
        if rule is not None and rule.latency_ms is not None:
            return rule.latency_ms
        return self._scenario.latency_ms

    def _answer(self, rule: FaultRule | None, asked: _Request) -> _Answer:
        unanswered = tokens.Usage(asked.prompt_tokens)
        if rule is not None and rule.drop:
            return _Answer(_DroppedResponse(), 0, unanswered)
        if rule is not None and rule.status is not None:
            return _Answer(_fault(rule.status, rule), rule.status, unanswered)
        script = self._scenario.script_for(asked.agent)
        if script is None:
            message = (
                f'fake-gemini: the scenario has no script for agent "{asked.agent}" and no "*" '
                "script"
            )
            return _Answer(_error(400, message), 400, unanswered)
        step = script.step(asked.step, system_text(asked.body))
        parts, usage = self._reply(step, asked)
        if asked.stream:
            events = wire.stream_events(parts, asked.model, usage)
            response: Response = StreamingResponse(_emit(events), media_type="text/event-stream")
        else:
            response = JSONResponse(wire.reply(parts, asked.model, usage))
        return _Answer(response, 200, usage)

    def _reply(self, step: Step, asked: _Request) -> tuple[list[dict[str, Any]], tokens.Usage]:
        """The reply's parts (thought part, answer, signature) and its token counts."""
        answer = fill_references(step.parts(asked.body), asked.body)
        thought = step.thought_summary()
        parts = [{"text": thought, "thought": True}] if wants_thoughts(asked.body) else []
        parts += answer
        if self._scenario.thought_signatures != "off":
            parts = self._signer.sign(parts, model=asked.model, agent=asked.agent, step=asked.step)
        cached = self._cache.cached_contents(asked.model, asked.agent, asked.body)
        usage = tokens.Usage(
            prompt=asked.prompt_tokens,
            candidates=tokens.count(answer),
            thoughts=tokens.text_tokens(thought),
            cached=tokens.prompt_tokens(asked.body, cached) if cached else 0,
        )
        return parts, usage

    def _reset_more(self) -> None:
        self._quota.reset()
        self._cache.reset()

    def _adopt(self, scenario: Scenario) -> None:
        self._quota.replace(scenario.quota)


def create_app(
    scenario: Scenario,
    record_path: str | Path | None = None,
    *,
    ledger: Ledger | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The fake server as an ASGI app; `record_path` also appends each entry to a JSONL file.
    `ledger` is where it records (a fresh one by default). `clock` tells the time, in seconds
    since the epoch, for the record and the quota windows: a test's fake clock moves the
    windows on without waiting them out.

    Each app signs with a secret of its own: another server's signatures are corrupted to it.
    """
    ledger = ledger if ledger is not None else Ledger(record_path)
    server = FakeServer(scenario, ledger, secrets.token_bytes(SECRET_BYTES), clock)
    routes = [
        Route("/{version}/models/{target}", server.model_call, methods=["POST"]),
        *server.control_routes(),
    ]
    return Starlette(routes=routes)


def system_text(body: Mapping[str, Any]) -> str:
    """The text of the request's system instruction."""
    system = body.get("systemInstruction")
    parts = system.get("parts", []) if isinstance(system, dict) else []
    return "\n".join(part.get("text") or "" for part in parts if isinstance(part, dict))


def agent_name(body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The agent ADK named in the system instruction, else the `x-baton-agent` header, else
    `"default"`."""
    names = AGENT_NAME.findall(system_text(body))
    if names:
        return str(names[-1])
    return headers.get(AGENT_HEADER) or DEFAULT_AGENT


def wants_thoughts(body: Mapping[str, Any]) -> bool:
    """Whether the request asks to see the model's thoughts
    (`generationConfig.thinkingConfig.includeThoughts`)."""
    thinking = wire.field(wire.field(body, "generationConfig"), "thinkingConfig")
    return wire.field(thinking, "includeThoughts") is True


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

"""The fake OpenAI-compatible server: a Starlette app that plays a `ChatScenario`, and a harness
that runs it in a thread.

    POST /v1/chat/completions   the model endpoint (`wire`), as LiteLLM's `openai/…` and
                                `hosted_vllm/…` providers call it with `api_base` set

A request is answered in this order: its key is checked (when the server was given one: a 401
otherwise), the fault rules may answer with an error (`scenario.ChatFault`), and then the
agent's script plays the request's step. Admin endpoints, as the fake Gemini's:

    GET  /_fake/health     {"status": "ok"}
    GET  /_fake/requests   the recorded entries, oldest first
    POST /_fake/reset      forget recorded entries, restart the request counters
    PUT  /_fake/faults     replace the fault rules (body: a list of rules)
    PUT  /_fake/scenario   replace the scenario

Each model request is recorded::

    {"ts": 1767000000.1, "replied": 1767000000.1, "agent": "triage", "model": "gpt-4.1-mini",
     "stream": false, "step": 0, "status": 200, "authorized": true, "prompt_tokens": 31,
     "completion_tokens": 12, "reasoning_tokens": 5, "request": {...the request body...}}

The key arrives in `Authorization: Bearer …`; headers are never recorded or echoed, only
whether the key was the one expected (`authorized`).
"""

from __future__ import annotations

import email.utils
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from testkit.control import FakeControl
from testkit.gemini.faults import FaultBook
from testkit.gemini.harness import ADMIN_TIMEOUT_S, serve_in_thread
from testkit.gemini.ledger import Ledger
from testkit.gemini.server import AGENT_HEADER, AGENT_NAME, DEFAULT_AGENT
from testkit.openai import wire
from testkit.openai.scenario import ChatFault, ChatScenario

logger = logging.getLogger(__name__)

_RULES = TypeAdapter(list[ChatFault])


class FakeOpenAIServer(FakeControl[ChatScenario, ChatFault]):
    """The server's state (scenario, fault counters, record) and its endpoints. `api_key`, when
    given, is the only key it accepts; `clock` tells the time for the record and the dates."""

    _scenario_type = ChatScenario
    _fault_rules = _RULES

    def __init__(
        self,
        scenario: ChatScenario,
        ledger: Ledger,
        *,
        api_key: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._scenario = scenario
        self._faults: FaultBook[ChatFault] = FaultBook(scenario.faults)
        self._ledger = ledger
        self._api_key = api_key
        self._clock = clock

    async def chat_completions(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "We could not parse the JSON body of your request.")
        received_s = self._clock()
        agent = agent_name(body, request.headers)
        step = sum(1 for m in body.get("messages") or [] if _role(m) == "assistant")
        authorized = self._authorized(request.headers.get("authorization", ""))
        response, status, counted = self._answer(body, agent, step, authorized, received_s)
        self._ledger.append(
            {
                "ts": received_s,
                "replied": self._clock(),
                "agent": agent,
                "model": body.get("model"),
                "stream": bool(body.get("stream")),
                "step": step,
                "status": status,
                "authorized": authorized,
                "prompt_tokens": counted.prompt,
                "completion_tokens": counted.completion,
                "reasoning_tokens": counted.reasoning,
                "request": body,
            }
        )
        logger.info("agent=%s step=%d status=%d prompt_tokens=%d completion_tokens=%d",
                    agent, step, status, counted.prompt, counted.completion)  # fmt: skip
        return response

    def _answer(
        self, body: dict[str, Any], agent: str, step: int, authorized: bool, received_s: float
    ) -> tuple[Response, int, wire.Usage]:
        """The response, its status and the tokens it counts (only the prompt's for an
        error)."""
        unanswered = wire.Usage(wire.prompt_tokens(body))
        if not authorized:
            return _error(401), 401, unanswered
        _, rule = self._faults.next_request(agent)
        if rule is not None:
            return _fault(rule, received_s), rule.status, unanswered
        script = self._scenario.script_for(agent)
        if script is None:
            message = f'the scenario has no script for agent "{agent}" and no "*" script'
            return _error(400, message), 400, unanswered
        played = script.step(step, _system_text(body))
        reply = wire.message(played, f"call_{uuid.uuid4().hex[:12]}")
        counted = wire.usage(played, reply, unanswered.prompt)
        model, reply_id = str(body.get("model")), f"chatcmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            events = wire.chunks(
                reply, model, counted, reply_id=reply_id, created=int(received_s),
                include_usage=include_usage,
            )  # fmt: skip
            return StreamingResponse(_emit(events), media_type="text/event-stream"), 200, counted
        answer = wire.completion(reply, model, counted, reply_id=reply_id, created=int(received_s))
        return JSONResponse(answer), 200, counted

    def _authorized(self, header: str) -> bool:
        if self._api_key is None:
            return True
        given = header.removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self._api_key.encode())


def create_app(
    scenario: ChatScenario,
    record_path: str | Path | None = None,
    *,
    api_key: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The fake server as an ASGI app; `record_path` also appends each entry to a JSONL file."""
    server = FakeOpenAIServer(scenario, Ledger(record_path), api_key=api_key, clock=clock)
    routes = [
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        *server.control_routes(),
    ]
    return Starlette(routes=routes)


class FakeOpenAI:
    """A running fake OpenAI-compatible server: its URLs and its admin endpoints."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    @property
    def base_url(self) -> str:
        """The API's base URL, as an OpenAI client or LiteLLM's `api_base` takes it."""
        return f"{self.url}/v1"

    @classmethod
    @contextmanager
    def start(
        cls,
        scenario: ChatScenario | Mapping[str, Any] | None = None,
        *,
        api_key: str | None = None,
        record_path: str | Path | None = None,
        host: str = "127.0.0.1",
    ) -> Iterator[FakeOpenAI]:
        """Serve `scenario` on a free port of `host` until the block ends, accepting only
        `api_key` when it is given."""
        played = ChatScenario.model_validate(scenario or {})
        app = create_app(played, record_path, api_key=api_key)
        with serve_in_thread(app, "fake OpenAI", host=host) as url:
            yield cls(url)

    def requests(self) -> list[dict[str, Any]]:
        """The entries recorded since the last reset, oldest first."""
        entries: list[dict[str, Any]] = self._admin("GET", "/_fake/requests").json()
        return entries

    def reset(self) -> None:
        """Forget recorded entries and restart the request counters."""
        self._admin("POST", "/_fake/reset")

    def set_faults(self, rules: Iterable[ChatFault | Mapping[str, Any]]) -> None:
        """Replace the fault rules."""
        validated = [ChatFault.model_validate(rule).model_dump(mode="json") for rule in rules]
        self._admin("PUT", "/_fake/faults", json=validated)

    def set_scenario(self, scenario: ChatScenario | Mapping[str, Any]) -> None:
        """Replace the scenario and its fault rules."""
        validated = ChatScenario.model_validate(scenario)
        self._admin("PUT", "/_fake/scenario", json=validated.model_dump(mode="json", by_alias=True))

    def _admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = httpx.request(method, self.url + path, timeout=ADMIN_TIMEOUT_S, **kwargs)
        return response.raise_for_status()


def agent_name(body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The agent ADK named in a system message, else the `x-baton-agent` header, else
    `"default"`."""
    names = AGENT_NAME.findall(_system_text(body))
    if names:
        return str(names[-1])
    return headers.get(AGENT_HEADER) or DEFAULT_AGENT


def _system_text(body: Mapping[str, Any]) -> str:
    """The text of the request's system (or developer) messages."""
    texts = [
        _text(m.get("content"))
        for m in body.get("messages") or []
        if _role(m) in ("system", "developer")
    ]
    return "\n".join(texts)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None


def _fault(rule: ChatFault, now_s: float) -> Response:
    headers: dict[str, str] = {}
    if rule.status == 429:
        headers = rate_limit_headers(rule, now_s)
    return Response(wire.error(rule.status), rule.status, headers=headers,
                    media_type="application/json")  # fmt: skip


def rate_limit_headers(rule: ChatFault, now_s: float) -> dict[str, str]:
    """The headers of a 429 that `rule` scripts."""
    headers: dict[str, str] = {}
    if rule.retry_after_s is not None:
        headers["retry-after"] = (
            email.utils.formatdate(now_s + rule.retry_after_s, usegmt=True)
            if rule.retry_after_date
            else _number(rule.retry_after_s)
        )
    if rule.retry_after_ms is not None:
        headers["retry-after-ms"] = _number(rule.retry_after_ms)
    for limit, reset in (("requests", rule.reset_requests), ("tokens", rule.reset_tokens)):
        if reset is not None:
            headers[f"x-ratelimit-reset-{limit}"] = reset
            headers[f"x-ratelimit-remaining-{limit}"] = "0" if rule.exhausted == limit else "1"
    return headers


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def _error(status: int, message: str | None = None) -> Response:
    return Response(wire.error(status, message), status, media_type="application/json")


async def _emit(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event

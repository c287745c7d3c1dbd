"""A stage on another provider: `BatonLiteLlm` through LiteLLM's real client, against the fake
OpenAI-compatible server (and, for Anthropic's 429, a server answering only that): the tool
loop and its token counts, each rate-limit shape becoming the same `RateLimitedError` delay,
no retries inside LiteLLM, keys kept out of everything recorded."""

from __future__ import annotations

import asyncio
import email.utils
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from google.adk.models.llm_request import LlmRequest
from google.genai import types
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchestrator.core.providers import parse_model
from orchestrator.core.rules import StageBudget
from orchestrator.core.settings import ProviderConfig, RetryConfig
from testkit.gemini.harness import serve_in_thread
from testkit.openai import FakeOpenAI
from workers import lite_llm
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.errors import (
    ModelRejectedError,
    ModelUnavailableError,
    RateLimitedError,
    UnrunnableStageError,
)
from workers.lite_llm import BatonLiteLlm, build_model

KEY = "sk-canary-litellm-0123456789abcdef"
MODEL = "openai/gpt-fake-mini"
RETRY = RetryConfig(transient_initial_s=0.01, transient_max_s=0.05)
ANSWER = {"summary": "Checkout divides cents twice."}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    scenario = {
        "agents": {
            "triage": [
                {"call": {"name": "read_file", "args": {"path": "cart.py"}}},
                {"json": ANSWER},
            ],
            "*": [{"text": "ok"}],
        }
    }
    with FakeOpenAI.start(scenario, api_key=KEY) as server:
        yield server


def model_for(fake: FakeOpenAI, model: str = MODEL, **retry: Any) -> BatonLiteLlm:
    ref = parse_model(model)
    cfg = ProviderConfig(provider=ref.provider, base_url=fake.base_url, api_key=SecretStr(KEY))
    return build_model(ref, cfg, RETRY.model_copy(update=retry))


def ask(model: BatonLiteLlm, text: str = "hi") -> list[Any]:
    request = LlmRequest(
        model=model.model, contents=[types.Content(role="user", parts=[types.Part(text=text)])]
    )

    async def run() -> list[Any]:
        return [reply async for reply in model.generate_content_async(request)]

    return asyncio.run(run())


def read_file(path: str) -> dict[str, Any]:
    """Read a file of the repository.

    Args:
        path: File, relative to the repository root.
    """
    return {"path": path, "content": "total = cents / 100 / 100"}


@pytest.mark.parametrize("streaming", [False, True])
def test_a_stage_runs_its_tool_loop_and_counts_the_providers_tokens(
    fake: FakeOpenAI, streaming: bool
) -> None:
    spec = AgentSpec(name="triage", instruction="Triage.", contract="Reply with JSON.",
                     budget=StageBudget(), tools=[read_file])  # fmt: skip
    usage, audit = Usage(), []

    async def run() -> str:
        model = model_for(fake)
        async with StageSession.open(
            build_agent(spec, model, usage), session_id="r:triage:1", state={},
            audit=audit.extend, labels={"stage": "triage"}, usage=usage, streaming=streaming,
        ) as session:  # fmt: skip
            return await session.turn("Do the triage stage now.", max_model_calls=5)

    reply = asyncio.run(run())

    served = fake.requests()
    second = served[1]["request"]["messages"]
    assert json.loads(reply) == ANSWER
    assert [(e["agent"], e["step"], e["status"], e["stream"]) for e in served] == [
        ("triage", 0, 200, streaming), ("triage", 1, 200, streaming),
    ]  # fmt: skip
    assert [m["role"] for m in second][-2:] == ["assistant", "tool"]
    assert json.loads(second[-1]["content"])["path"] == "cart.py"
    assert usage.requests == 2
    assert usage.prompt_tokens_total == sum(e["prompt_tokens"] for e in served)
    assert usage.prompt_tokens_max == max(e["prompt_tokens"] for e in served)
    # OpenAI's completion tokens include the reasoning ones: counted once, not twice
    assert usage.output_tokens == sum(e["completion_tokens"] for e in served)
    assert any(e["kind"] == "tool_call" for e in audit)


@pytest.mark.parametrize(
    ("fault", "expected_s"),
    [
        ({"retry_after_s": 3}, 3.0),
        ({"retry_after_s": 40, "retry_after_date": True}, 40.0),
        ({"retry_after_ms": 1500}, 1.5),
        ({"reset_requests": "6m0s"}, 360.0),
        ({"reset_requests": "20ms", "reset_tokens": "1m30s", "exhausted": "tokens"}, 90.0),
        ({"retry_after_s": 2, "reset_requests": "6m0s"}, 2.0),
    ],
)
def test_each_openai_429_shape_becomes_the_same_delay(
    fake: FakeOpenAI, fault: dict[str, Any], expected_s: float
) -> None:
    fake.set_faults([{"status": 429, **fault}])

    with pytest.raises(RateLimitedError) as limited:
        ask(model_for(fake))

    assert limited.value.delay_s == pytest.approx(expected_s, abs=1.5)
    assert limited.value.delay_s is not None and limited.value.delay_s <= expected_s
    assert "openai 429" in limited.value.message
    assert [e["status"] for e in fake.requests()] == [429]  # LiteLLM retried nothing


def test_a_429_without_a_delay_has_none(fake: FakeOpenAI) -> None:
    fake.set_faults([{"status": 429}])
    with pytest.raises(RateLimitedError) as limited:
        ask(model_for(fake))
    assert limited.value.delay_s is None


def anthropic_429(reset_s: float) -> Starlette:
    """A server answering every Messages API call as Anthropic answers one over its limit."""
    reset = datetime.fromtimestamp(time.time() + reset_s, UTC).isoformat().replace("+00:00", "Z")

    async def messages(request: Request) -> JSONResponse:
        said = "Number of request tokens has exceeded your per-minute rate limit"
        body = {"type": "error", "error": {"type": "rate_limit_error", "message": said}}
        headers = {
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": reset,
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": email.utils.formatdate(usegmt=True),
        }
        return JSONResponse(body, 429, headers=headers)

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


@pytest.mark.parametrize("retry_after", [None, "7"])
def test_anthropics_429_becomes_the_same_delay(retry_after: str | None) -> None:
    app = anthropic_429(reset_s=25)
    if retry_after is not None:
        inner = app.router.routes[0].endpoint  # type: ignore[attr-defined]

        async def with_retry_after(request: Request) -> JSONResponse:
            response: JSONResponse = await inner(request)
            response.headers["retry-after"] = retry_after
            return response

        app = Starlette(routes=[Route("/v1/messages", with_retry_after, methods=["POST"])])
    with serve_in_thread(app, "fake Anthropic") as url:
        ref = parse_model("anthropic/claude-fake")
        cfg = ProviderConfig(provider="anthropic", base_url=url, api_key=SecretStr(KEY))
        with pytest.raises(RateLimitedError) as limited:
            ask(build_model(ref, cfg, RETRY))

    expected = 25.0 if retry_after is None else 7.0
    assert limited.value.delay_s == pytest.approx(expected, abs=1.5)
    assert "anthropic 429" in limited.value.message


def test_a_5xx_is_retried_inside_the_call_then_succeeds(fake: FakeOpenAI) -> None:
    fake.set_faults([{"requests": [1], "status": 503}])
    [reply] = ask(model_for(fake))
    assert reply.content.parts[0].text == "ok"
    assert [e["status"] for e in fake.requests()] == [503, 200]


def test_5xx_that_outlast_the_backoff_are_unavailability(fake: FakeOpenAI) -> None:
    fake.set_faults([{"status": 500}])
    with pytest.raises(ModelUnavailableError, match=r"openai 500"):
        ask(model_for(fake, transient_attempts=2))
    assert [e["status"] for e in fake.requests()] == [500, 500]


def test_a_refused_key_fails_at_once_naming_the_variable_not_the_key(fake: FakeOpenAI) -> None:
    ref = parse_model(MODEL)
    cfg = ProviderConfig(provider="openai", base_url=fake.base_url, api_key=SecretStr("sk-bad-1"))
    with pytest.raises(ModelRejectedError) as refused:
        ask(build_model(ref, cfg, RETRY))
    assert str(refused.value) == "the openai API refused the key (401); check OPENAI_API_KEY"
    assert [e["status"] for e in fake.requests()] == [401]


def test_a_missing_key_or_server_is_said_before_any_call() -> None:
    with pytest.raises(ModelRejectedError, match=r"set OPENAI_API_KEY \(or OPENAI_API_KEY_FILE\)"):
        build_model(parse_model(MODEL), ProviderConfig(provider="openai"), RETRY)
    with pytest.raises(ModelRejectedError, match="set BATON_VLLM_BASE_URL"):
        build_model(parse_model("hosted_vllm/llama"), ProviderConfig(provider="hosted_vllm"), RETRY)
    assert (
        build_model(
            parse_model("ollama_chat/qwen3"), ProviderConfig(provider="ollama_chat"), RETRY
        ).provider
        == "ollama_chat"
    )  # a local Ollama takes no key


def test_the_key_goes_in_the_header_only(fake: FakeOpenAI) -> None:
    model = model_for(fake)
    ask(model)

    [entry] = fake.requests()
    assert entry["authorized"] is True  # the key reached the server, in its header
    assert KEY not in json.dumps(entry["request"])
    assert KEY not in repr(model) and KEY not in model.model_dump_json()


def test_a_vllm_server_is_reached_the_same_way(fake: FakeOpenAI) -> None:
    ref = parse_model("hosted_vllm/meta-llama/Llama-3.1-8B")
    cfg = ProviderConfig(provider="hosted_vllm", base_url=fake.base_url, api_key=SecretStr(KEY))
    [reply] = ask(build_model(ref, cfg, RETRY))
    assert reply.content.parts[0].text == "ok"
    assert fake.requests()[0]["model"] == "meta-llama/Llama-3.1-8B"


def test_importing_baton_does_not_import_litellm() -> None:
    code = (
        "import sys, orchestrator.control.cli, workers.tasks, workers.execution, workers.lite_llm; "
        "print(sorted(m for m in ('litellm', 'openai') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


def test_a_worker_without_litellm_refuses_the_stage_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)  # what an install without the extra has
    lite_llm.import_litellm.cache_clear()  # an earlier test of this worker imported it
    try:
        with pytest.raises(UnrunnableStageError, match=r"pip install 'baton\[litellm\]'"):
            lite_llm.import_litellm()
    finally:
        lite_llm.import_litellm.cache_clear()

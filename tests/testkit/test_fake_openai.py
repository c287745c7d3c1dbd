"""The fake OpenAI-compatible server's wire facts, checked with the real `openai` client (the one
LiteLLM's `openai/…` provider sends through): a reply, tool calls, usage, streaming, a 429 with
OpenAI's rate-limit headers, a wrong key; and what the fake records."""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from testkit.openai import FakeOpenAI

KEY = "sk-fake-openai-canary-42"
SYSTEM = 'Be brief.\n\nYou are an agent. Your internal name is "triage".'
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    scenario = {
        "agents": {
            "triage": [
                {"call": {"name": "read_file", "args": {"path": "shop/cart.py"}}},
                {"json": {"actionable": True}, "thought": "It is a bug."},
            ],
            "*": [{"text": "hello"}],
        }
    }
    with FakeOpenAI.start(scenario, api_key=KEY) as server:
        yield server


def client(fake: FakeOpenAI, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=fake.base_url, max_retries=0)


def tokens(value: Any) -> int:
    return math.ceil(len(json.dumps(value, separators=(",", ":"), ensure_ascii=False)) / 4)


def test_a_tool_call_reply_has_openais_shape_and_usage(fake: FakeOpenAI) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
    reply = client(fake).chat.completions.create(model="gpt-fake", messages=messages, tools=[TOOL])

    [choice] = reply.choices
    [call] = choice.message.tool_calls or []
    entry = fake.requests()[0]
    assert reply.object == "chat.completion" and reply.model == "gpt-fake"
    assert reply.id.startswith("chatcmpl-")
    assert (choice.finish_reason, choice.message.role, choice.message.content) == (
        "tool_calls", "assistant", None,
    )  # fmt: skip
    assert (call.type, call.function.name) == ("function", "read_file")
    assert json.loads(call.function.arguments) == {"path": "shop/cart.py"}  # a JSON string
    reasoning = math.ceil(len("I will call read_file.") / 4)
    completion = tokens([call.model_dump()]) + reasoning
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == tokens([messages, [TOOL]])
    assert reply.usage.completion_tokens == completion
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + completion
    assert reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == reasoning
    assert (entry["agent"], entry["step"], entry["status"], entry["authorized"]) == (
        "triage", 0, 200, True,
    )  # fmt: skip
    assert entry["completion_tokens"] == completion


def test_the_step_is_the_number_of_assistant_messages(fake: FakeOpenAI) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
    ]  # fmt: skip
    reply = client(fake).chat.completions.create(model="gpt-fake", messages=messages)  # type: ignore[arg-type]

    assert reply.choices[0].finish_reason == "stop"
    assert json.loads(reply.choices[0].message.content or "") == {"actionable": True}
    assert reply.usage is not None and reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == math.ceil(
        len("It is a bug.") / 4
    )
    assert fake.requests()[0]["step"] == 1


def test_a_streamed_reply_comes_in_chunks_then_usage_then_done(fake: FakeOpenAI) -> None:
    stream = client(fake).chat.completions.create(
        model="gpt-fake",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 3
    assert chunks[0].choices[0].delta.content == "hello"
    assert chunks[1].choices[0].finish_reason == "stop"
    assert chunks[2].choices == [] and chunks[2].usage is not None
    assert chunks[2].usage.completion_tokens == tokens("hello") + math.ceil(
        len("I will answer in text.") / 4
    )
    assert fake.requests()[0]["stream"] is True


def test_a_429_carries_openais_rate_limit_headers_then_the_next_request_succeeds(
    fake: FakeOpenAI,
) -> None:
    fake.set_faults([{"requests": [1], "status": 429, "retry_after_s": 3,
                      "retry_after_ms": 2500, "reset_requests": "6m0s", "reset_tokens": "20ms",
                      "exhausted": "tokens"}])  # fmt: skip
    with pytest.raises(openai.RateLimitError) as refused:
        client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    served = client(fake).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )

    headers = refused.value.response.headers
    assert refused.value.status_code == 429
    assert refused.value.body == {
        "message": "Rate limit reached for requests.", "type": "requests", "param": None,
        "code": "rate_limit_exceeded",
    }  # fmt: skip
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("3", "2500")
    assert (headers["x-ratelimit-reset-requests"], headers["x-ratelimit-reset-tokens"]) == (
        "6m0s", "20ms",
    )  # fmt: skip
    assert (headers["x-ratelimit-remaining-requests"], headers["x-ratelimit-remaining-tokens"]) == (
        "1", "0",
    )  # fmt: skip
    assert served.choices[0].message.content == "hello"
    assert [e["status"] for e in fake.requests()] == [429, 200]


def test_retry_after_may_be_sent_as_an_http_date(fake: FakeOpenAI) -> None:
    fake.set_faults([{"status": 429, "retry_after_s": 30, "retry_after_date": True}])
    with pytest.raises(openai.RateLimitError) as refused:
        client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    when = email.utils.parsedate_to_datetime(refused.value.response.headers["retry-after"])
    assert 28 <= when.timestamp() - time.time() <= 31


def test_a_wrong_key_is_refused_and_no_key_is_ever_recorded(fake: FakeOpenAI) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        client(fake, key="sk-wrong-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    recorded = json.dumps(fake.requests())
    assert refused.value.status_code == 401
    assert "sk-wrong-key" not in str(refused.value.body)
    assert [e["authorized"] for e in fake.requests()] == [False, True]
    assert KEY not in recorded and "sk-wrong-key" not in recorded

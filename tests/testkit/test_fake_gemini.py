"""The fake Gemini server driven by the real google-genai client: replies, faults, recording.

The ADK end-to-end test and the process test live in test_fake_gemini_adk.py and
test_fake_gemini_process.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types
from pydantic import ValidationError

from testkit.gemini import FakeGemini, Scenario

MODEL = "gemini-3.8-flash"
SCENARIO: dict[str, Any] = {
    "agents": {
        "search": {
            "steps": [
                {"call": {"name": "read_file", "args": {"path": "a.py"}}},
                {"call": {"name": "read_file", "args": {"path": "b.py"}}},
                {"json": {"root_cause": "cents are divided twice"}},
            ]
        },
        "fanout": [
            {
                "calls": [
                    {"name": "read_file", "args": {"path": "a.py"}},
                    {"name": "grep", "args": {}},
                ]
            }
        ],
        "*": [{"text": "ok"}],
    }
}
OK_CANDIDATES_TOKENS = 4
"""`[{"text":"ok"}]` is 15 characters: ceil(15 / 4)."""
ANSWER_THOUGHTS_TOKENS = 6
"""The default thought of a text step, "I will answer in text.", is 22 characters: ceil(22 / 4)."""

StartFake = Callable[..., FakeGemini]
ClientFor = Callable[..., genai.Client]


def as_agent(name: str) -> types.GenerateContentConfig:
    """A config whose system instruction names the agent the way ADK does."""
    instruction = f'Find the bug.\n\nYou are an agent. Your internal name is "{name}".'
    return types.GenerateContentConfig(system_instruction=instruction)


def ask(client: genai.Client, config: types.GenerateContentConfig | None = None) -> Any:
    return client.models.generate_content(model=MODEL, contents="hi", config=config)


def expected_prompt_tokens(request: dict[str, Any]) -> int:
    prompt = [
        request.get("systemInstruction"),
        request.get("contents", []),
        request.get("tools", []),
    ]
    return math.ceil(len(json.dumps(prompt, separators=(",", ":"), ensure_ascii=False)) / 4)


def statuses(fake: FakeGemini) -> list[int]:
    return [entry["status"] for entry in fake.requests()]


# Replies


def test_generate_content_returns_the_scripted_text_with_usage(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)

    response = ask(client_for(fake))

    [entry] = fake.requests()
    prompt = expected_prompt_tokens(entry["request"])
    assert response.text == "ok"
    assert response.usage_metadata.prompt_token_count == prompt
    assert response.usage_metadata.candidates_token_count == OK_CANDIDATES_TOKENS
    assert response.usage_metadata.thoughts_token_count == ANSWER_THOUGHTS_TOKENS
    assert response.usage_metadata.total_token_count == (
        prompt + OK_CANDIDATES_TOKENS + ANSWER_THOUGHTS_TOKENS
    )
    assert response.usage_metadata.cached_content_token_count is None
    assert response.model_version == MODEL
    assert (entry["prompt_tokens"], entry["candidates_tokens"]) == (prompt, OK_CANDIDATES_TOKENS)
    assert (entry["thoughts_tokens"], entry["cached_tokens"]) == (ANSWER_THOUGHTS_TOKENS, 0)
    assert entry["request"]["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert entry["request_chars"] == len(json.dumps(entry["request"], separators=(",", ":")))
    assert (entry["agent"], entry["model"], entry["stream"], entry["step"]) == (
        "default",
        MODEL,
        False,
        0,
    )


def test_step_is_the_number_of_model_turns_and_the_last_step_repeats(
    start_fake: StartFake,
    client_for: ClientFor,
) -> None:
    fake = start_fake(SCENARIO)
    client = client_for(fake)
    turns: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="go")])]
    replies = []
    for _ in range(4):
        response = client.models.generate_content(
            model=MODEL, contents=turns, config=as_agent("search")
        )
        replies.append(response)
        turns += [
            response.candidates[0].content,
            types.Content(role="user", parts=[types.Part(text="more")]),
        ]

    assert [r.function_calls[0].args["path"] for r in replies[:2]] == ["a.py", "b.py"]
    assert [r.text for r in replies[2:]] == ['{"root_cause":"cents are divided twice"}'] * 2
    assert [entry["step"] for entry in fake.requests()] == [0, 1, 2, 3]
    assert {entry["agent"] for entry in fake.requests()} == {"search"}


def test_a_variant_plays_for_a_session_whose_instruction_holds_its_text(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    script = {
        "steps": [{"text": "first try"}],
        "variants": [{"when": "previous attempt failed", "steps": [{"text": "again"}]}],
    }
    fake = start_fake({"agents": {"fix": script}})
    client = client_for(fake)

    def instructed(extra: str) -> str | None:
        config = types.GenerateContentConfig(
            system_instruction=f'{extra}\n\nYou are an agent. Your internal name is "fix".'
        )
        return client.models.generate_content(model=MODEL, contents="go", config=config).text

    assert instructed("") == "first try"
    assert instructed("Your previous attempt failed: 2 tests.") == "again"
    assert instructed("previous attempt") == "first try"  # the whole text, not a part of it


def test_a_calls_step_replies_with_several_function_calls(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)

    response = ask(client_for(fake), as_agent("fanout"))

    calls = [(call.name, call.args) for call in response.function_calls]
    assert calls == [("read_file", {"path": "a.py"}), ("grep", {})]


def test_an_extract_step_replies_with_the_requests_lines_that_hold_its_marker(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake({"agents": {"summariser": [{"extract": "FACT:"}]}})
    instruction = 'Keep every FACT: line.\n\nYou are an agent. Your internal name is "summariser".'
    config = types.GenerateContentConfig(system_instruction=instruction)
    history = (
        "read_page returned:\npage: 0\ntext: 00-001 nothing unusual\n"
        "- FACT: refunds are settled by team Kestrel\n00-002 nothing unusual\n"
        "model: FACT: refunds are settled by team Kestrel\nfooter FACT: pages end at 39"
    )

    client = client_for(fake)
    reply = client.models.generate_content(model=MODEL, contents=history, config=config)
    empty = client.models.generate_content(model=MODEL, contents="no facts here", config=config)

    assert reply.text == "FACT: refunds are settled by team Kestrel\nFACT: pages end at 39"
    assert empty.text == "(no line holds FACT:)"


def test_the_agent_header_names_the_agent_when_adk_did_not(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)

    response = ask(client_for(fake, headers={"x-baton-agent": "search"}))

    assert response.function_calls[0].args == {"path": "a.py"}
    assert fake.requests()[0]["agent"] == "search"


def test_an_unknown_agent_without_a_star_script_is_a_400_naming_it(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake({"agents": {"search": [{"text": "found"}]}})

    with pytest.raises(errors.ClientError) as caught:
        ask(client_for(fake), as_agent("triage"))

    assert caught.value.code == 400
    assert caught.value.status == "INVALID_ARGUMENT"
    assert '"triage"' in caught.value.message
    assert statuses(fake) == [400]


def test_streamed_text_arrives_in_chunks_that_each_carry_usage(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    reply = "The price is divided by 100 twice. " * 3
    fake = start_fake({"agents": {"*": [{"text": reply}]}})

    async def stream() -> list[types.GenerateContentResponse]:
        chunks = await client_for(fake).aio.models.generate_content_stream(
            model=MODEL, contents="hi"
        )
        return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())

    [entry] = fake.requests()
    reply_tokens = math.ceil(len(json.dumps([{"text": reply}], separators=(",", ":"))) / 4)
    assert len(chunks) >= 2
    assert "".join(chunk.text for chunk in chunks) == reply
    assert all(c.usage_metadata.prompt_token_count == entry["prompt_tokens"] for c in chunks)
    assert chunks[-1].usage_metadata.candidates_token_count == reply_tokens
    assert [c.candidates[0].finish_reason for c in chunks[-2:]] == [None, types.FinishReason.STOP]
    assert (entry["stream"], entry["candidates_tokens"]) == (True, reply_tokens)


# Faults


def test_a_429_carries_retry_info_and_retry_after_then_the_next_request_succeeds(
    start_fake: StartFake,
    client_for: ClientFor,
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults(
        [
            {
                "agent": "search",
                "requests": [1],
                "status": 429,
                "retry_delay_s": 3,
                "retry_after_s": 4,
            }
        ]
    )
    client = client_for(fake)

    with pytest.raises(errors.APIError) as caught:
        ask(client, as_agent("search"))
    retried = ask(client, as_agent("search"))

    assert caught.value.code == 429
    assert caught.value.status == "RESOURCE_EXHAUSTED"
    assert caught.value.details["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}
    ]
    assert caught.value.response.headers["retry-after"] == "4"
    assert retried.function_calls[0].args == {"path": "a.py"}
    assert statuses(fake) == [429, 200]


def test_a_429_without_retry_delay_has_no_retry_info(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([{"status": 429, "retry_delay_s": None}])

    with pytest.raises(errors.ClientError) as caught:
        ask(client_for(fake))

    assert caught.value.code == 429
    assert "details" not in caught.value.details["error"]
    assert "retry-after" not in caught.value.response.headers


@pytest.mark.parametrize(
    ("status", "error_class", "status_name"),
    [
        (400, errors.ClientError, "INVALID_ARGUMENT"),
        (401, errors.ClientError, "UNAUTHENTICATED"),
        (403, errors.ClientError, "PERMISSION_DENIED"),
        (500, errors.ServerError, "INTERNAL"),
        (503, errors.ServerError, "UNAVAILABLE"),
    ],
)
def test_an_error_status_surfaces_as_the_matching_genai_error(
    start_fake: StartFake,
    status: int,
    error_class: type[errors.APIError],
    status_name: str,
    client_for: ClientFor,
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([{"status": status}])

    with pytest.raises(error_class) as caught:
        ask(client_for(fake))

    assert (caught.value.code, caught.value.status) == (status, status_name)
    assert statuses(fake) == [status]


@pytest.mark.parametrize("stream", [False, True])
def test_a_dropped_connection_surfaces_as_a_protocol_error(
    start_fake: StartFake,
    stream: bool,
    client_for: ClientFor,
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([{"drop": True}])
    client = client_for(fake)

    async def stream_reply() -> None:
        async for _ in await client.aio.models.generate_content_stream(model=MODEL, contents="hi"):
            pass

    with pytest.raises(httpx.RemoteProtocolError):
        if stream:
            asyncio.run(stream_reply())
        else:
            ask(client)

    assert statuses(fake) == [0]


@pytest.mark.parametrize(
    "scenario",
    [
        {"agents": {"*": [{"text": "ok"}]}, "latency_ms": 400},
        {"agents": {"*": [{"text": "ok"}]}, "faults": [{"latency_ms": 400}]},
    ],
    ids=["scenario-latency", "rule-latency"],
)
def test_latency_delays_the_reply(
    start_fake: StartFake, scenario: dict[str, Any], client_for: ClientFor
) -> None:
    client = client_for(start_fake(scenario))

    started = time.monotonic()
    response = ask(client)
    elapsed_s = time.monotonic() - started

    assert response.text == "ok"
    assert 0.4 <= elapsed_s < 3.0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"every": 2, "status": 503}, [200, 503, 200, 503, 200, 503]),
        ({"times": 2, "status": 503}, [503, 503, 200, 200, 200, 200]),
        ({"every": 2, "times": 2, "status": 503}, [200, 503, 200, 503, 200, 200]),
        ({"requests": [1, 3], "status": 503}, [503, 200, 503, 200, 200, 200]),
        ({"agent": "search", "status": 503}, [200] * 6),
    ],
    ids=["every", "times", "every-times", "requests", "other-agent"],
)
def test_selectors_pick_which_requests_fail(
    start_fake: StartFake,
    rule: dict[str, Any],
    expected: list[int],
    client_for: ClientFor,
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([rule])
    client = client_for(fake)

    for _ in expected:
        try:
            ask(client)
        except errors.ServerError:
            pass

    assert statuses(fake) == expected


def test_the_first_matching_rule_wins(start_fake: StartFake, client_for: ClientFor) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([{"requests": [1], "status": 403}, {"status": 500}])

    for _ in range(2):
        with pytest.raises(errors.APIError):
            ask(client_for(fake))

    assert statuses(fake) == [403, 500]


def test_reset_clears_the_record_and_restarts_request_counters(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)
    fake.set_faults([{"requests": [1], "status": 500}])
    client = client_for(fake)
    with pytest.raises(errors.ServerError):
        ask(client)

    fake.reset()
    assert fake.requests() == []
    with pytest.raises(errors.ServerError):
        ask(client)

    assert statuses(fake) == [500]


def test_set_scenario_replaces_the_replies_and_the_faults(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake({"agents": {"*": [{"text": "old"}]}, "faults": [{"status": 500}]})

    fake.set_scenario({"agents": {"*": [{"text": "new"}]}})

    assert ask(client_for(fake)).text == "new"


def test_invalid_fault_rules_are_rejected_with_422(start_fake: StartFake) -> None:
    fake = start_fake(SCENARIO)

    response = httpx.put(f"{fake.url}/_fake/faults", json=[{"status": 418}], timeout=5)

    assert response.status_code == 422
    assert "418" in response.text


# Recording


def test_the_record_file_has_one_line_per_request_and_never_the_api_key(
    start_fake: StartFake,
    tmp_path: Path,
    client_for: ClientFor,
) -> None:
    canary_key = "canary-key-3f9d1c7be2"
    record_path = tmp_path / "requests.jsonl"
    fake = start_fake(SCENARIO, record_path=record_path)
    fake.set_faults([{"requests": [2], "status": 429, "retry_delay_s": 3}])
    client = client_for(fake, api_key=canary_key)

    ask(client)
    with pytest.raises(errors.ClientError):
        ask(client)
    ask(client, as_agent("search"))

    text = record_path.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(line["agent"], line["status"]) for line in lines] == [
        ("default", 200),
        ("default", 429),
        ("search", 200),
    ]
    assert canary_key not in text
    assert canary_key not in json.dumps(fake.requests())


def test_concurrent_requests_never_interleave_record_lines(
    start_fake: StartFake,
    tmp_path: Path,
    client_for: ClientFor,
) -> None:
    record_path = tmp_path / "requests.jsonl"
    fake = start_fake({"agents": {"*": [{"text": "x" * 5000}]}}, record_path=record_path)
    client = client_for(fake)

    async def many() -> None:
        prompts = [f"request {n} " + "y" * 5000 for n in range(20)]
        await asyncio.gather(
            *(client.aio.models.generate_content(model=MODEL, contents=p) for p in prompts)
        )

    asyncio.run(many())

    lines = [json.loads(line) for line in record_path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 20
    assert {line["status"] for line in lines} == {200}


# Scenario format


def test_a_step_is_exactly_one_kind_of_reply() -> None:
    with pytest.raises(ValidationError, match="exactly one of text, json, call, calls, extract"):
        Scenario.model_validate({"agents": {"*": [{"text": "a", "json": {"b": 1}}]}})
    with pytest.raises(ValidationError, match=r"\(given: text, extract\)"):
        Scenario.model_validate({"agents": {"*": [{"text": "a", "extract": "FACT:"}]}})


def test_a_fault_rule_needs_an_effect() -> None:
    with pytest.raises(ValidationError, match="needs an effect"):
        Scenario.model_validate({"faults": [{"agent": "search", "every": 2}]})


def test_a_scripted_reply_can_repeat_a_field_of_a_tool_response() -> None:
    from testkit.gemini.server import fill_references

    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "publish", "args": {}}}]},
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "publish",
                            "response": {"commit": "abc123", "branch": 'b"q'},
                        }
                    }
                ],
            },
        ]
    }
    script = '{"commit":"{{fn:publish.commit}}","branch":"{{fn:publish.branch}}",'
    parts = [{"text": script + '"x":"{{fn:other.y}}"}'}]

    assert fill_references(parts, body) == [
        {"text": '{"commit":"abc123","branch":"b\\"q","x":"<no other.y in the request>"}'}
    ]

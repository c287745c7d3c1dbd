"""The fake Gemini server thinks and signs like Gemini 3, driven by the real google-genai client:
thought signatures (issued, checked on the current turn, read back as the step), thought parts,
and the thoughts and cached token counts."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from testkit.gemini import FakeGemini

MODEL = "gemini-3.8-flash"
ROOT_CAUSE = '{"root_cause":"cents are divided twice"}'
SCENARIO: dict[str, Any] = {
    "agents": {
        "search": [
            {"call": {"name": "read_file", "args": {"path": "a.py"}}},
            {"call": {"name": "read_file", "args": {"path": "b.py"}}},
            {"json": {"root_cause": "cents are divided twice"}},
        ],
        "fanout": [
            {"calls": [{"name": "read_file", "args": {"path": "a.py"}}, {"name": "grep"}]},
            {"text": "done"},
        ],
        "*": [{"text": "ok"}],
    }
}
MISSING = (
    "Function call is missing a thought_signature in functionCall parts. This is required for "
    "tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `default_api:read_file` , position {}. Please "
    "refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)
"""Gemini 3's wording, as reported in public bug reports (e.g. csells/dartantic#86)."""
CORRUPTED = "Corrupted thought signature."
THOUGHT = "The user greets me, so I greet back."
SHOW_THOUGHTS = types.GenerateContentConfig(
    thinking_config=types.ThinkingConfig(include_thoughts=True)
)

StartFake = Callable[..., FakeGemini]
ClientFor = Callable[..., genai.Client]


def agent_client(client_for: ClientFor, fake: FakeGemini, agent: str) -> genai.Client:
    return client_for(fake, headers={"x-baton-agent": agent})


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def converse(client: genai.Client, replies: int) -> list[types.Content]:
    """A conversation of `replies` model replies, each call answered by its tool."""
    contents = [user("Prices are off by 100x.")]
    for _ in range(replies):
        response = client.models.generate_content(model=MODEL, contents=contents)
        contents.append(response.candidates[0].content)
        answers = [
            types.Part.from_function_response(name=call.name or "", response={"ok": True})
            for call in response.function_calls or []
        ]
        if answers:
            contents.append(types.Content(role="user", parts=answers))
    return contents


def with_signature(content: types.Content, signature: bytes | None) -> types.Content:
    """The model content with `signature` (None: none) on its first part."""
    parts = list(content.parts or [])
    parts[0] = parts[0].model_copy(update={"thought_signature": signature})
    return content.model_copy(update={"parts": parts})


def with_args(content: types.Content, args: dict[str, Any]) -> types.Content:
    """The model content with other arguments in its first call (the signature left as is)."""
    parts = list(content.parts or [])
    call = parts[0].function_call
    assert call is not None
    parts[0] = parts[0].model_copy(update={"function_call": call.model_copy(update={"args": args})})
    return content.model_copy(update={"parts": parts})


def signature_of(content: types.Content) -> bytes:
    signature = (content.parts or [])[0].thought_signature
    assert signature is not None
    return signature


def statuses(fake: FakeGemini) -> list[int]:
    return [entry["status"] for entry in fake.requests()]


def prompt_tokens(request: dict[str, Any], contents: int) -> int:
    """The documented prompt count of `request` cut to its first `contents` contents."""
    prompt = [
        request.get("systemInstruction"),
        request["contents"][:contents],
        request.get("tools", []),
    ]
    return math.ceil(len(json.dumps(prompt, separators=(",", ":"), ensure_ascii=False)) / 4)


# Signatures issued


def test_only_the_first_function_call_of_a_parallel_reply_carries_a_signature(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)

    [_, reply] = converse(agent_client(client_for, fake, "fanout"), replies=1)[:2]

    first, second = reply.parts or []
    assert (first.function_call.name, second.function_call.name) == ("read_file", "grep")  # type: ignore[union-attr]
    assert isinstance(first.thought_signature, bytes) and first.thought_signature
    assert second.thought_signature is None


def test_each_step_of_a_tool_loop_signs_its_first_call_and_a_text_reply_its_last_part(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)

    contents = converse(agent_client(client_for, fake, "search"), replies=3)

    first_call, second_call, answer = contents[1], contents[3], contents[5]
    assert signature_of(first_call) != signature_of(second_call)
    assert [part.text for part in answer.parts or []] == [ROOT_CAUSE]
    assert (answer.parts or [])[-1].thought_signature
    assert statuses(fake) == [200, 200, 200]
    assert [entry["step"] for entry in fake.requests()] == [0, 1, 2]
    last = fake.requests()[-1]["request"]["contents"]
    assert ["thoughtSignature" in c["parts"][0] for c in last if c["role"] == "model"] == [True] * 2


# The current turn is checked


@pytest.mark.parametrize(("stripped", "position"), [(1, 2), (3, 4)])
def test_a_current_turn_call_without_its_signature_is_a_400_naming_the_call_and_position(
    start_fake: StartFake, client_for: ClientFor, stripped: int, position: int
) -> None:
    fake = start_fake(SCENARIO)
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=2)
    contents[stripped] = with_signature(contents[stripped], None)

    with pytest.raises(errors.ClientError) as refused:
        client.models.generate_content(model=MODEL, contents=contents)

    assert (refused.value.code, refused.value.status) == (400, "INVALID_ARGUMENT")
    assert refused.value.message == MISSING.format(position)
    assert statuses(fake) == [200, 200, 400]


def corrupt(contents: list[types.Content], how: str, other: list[types.Content]) -> None:
    """Spoil the signature of the first call in `contents` in one of four ways."""
    first, second = contents[1], contents[3]
    if how == "altered":
        signature = bytearray(signature_of(first))
        signature[-1] ^= 1
        contents[1] = with_signature(first, bytes(signature))
    elif how == "another-calls":
        contents[1] = with_signature(first, signature_of(second))
    elif how == "another-servers":
        contents[1] = with_signature(first, signature_of(other[1]))
    elif how == "arguments-changed":
        contents[1] = with_args(first, {"path": "c.py"})


@pytest.mark.parametrize(
    "how", ["altered", "another-calls", "another-servers", "arguments-changed"]
)
def test_a_current_turn_signature_not_issued_for_that_call_here_is_a_400_corrupted(
    start_fake: StartFake, client_for: ClientFor, how: str
) -> None:
    fake, other_fake = start_fake(SCENARIO), start_fake(SCENARIO)
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=2)
    corrupt(contents, how, converse(agent_client(client_for, other_fake, "search"), replies=1))

    with pytest.raises(errors.ClientError) as refused:
        client.models.generate_content(model=MODEL, contents=contents)

    assert (refused.value.code, refused.value.status) == (400, "INVALID_ARGUMENT")
    assert refused.value.message == CORRUPTED


def test_calls_of_an_earlier_turn_are_not_checked(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=3)
    contents[1] = with_signature(contents[1], None)
    contents[3] = with_signature(contents[3], b"not issued here")

    with pytest.raises(errors.ClientError):
        client.models.generate_content(model=MODEL, contents=contents[:5])
    next_turn = client.models.generate_content(model=MODEL, contents=[*contents, user("Thanks.")])

    assert next_turn.text == ROOT_CAUSE
    assert statuses(fake) == [200, 200, 200, 400, 200]


def test_a_refused_request_never_reaches_the_fault_rules(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=1)
    fake.set_faults([{"times": 1, "status": 503}])

    for signature in (None, signature_of(contents[1])):
        try:
            client.models.generate_content(
                model=MODEL, contents=[contents[0], with_signature(contents[1], signature)]
            )
        except errors.APIError:
            pass

    assert statuses(fake) == [200, 400, 503]


@pytest.mark.parametrize(("mode", "signed"), [("optional", True), ("off", False)])
def test_a_gemini_2_5_like_server_checks_no_signatures(
    start_fake: StartFake, client_for: ClientFor, mode: str, signed: bool
) -> None:
    fake = start_fake({**SCENARIO, "thought_signatures": mode})
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=2)

    contents[1] = with_signature(contents[1], None)
    contents[3] = with_signature(contents[3], b"not issued here")
    reply = client.models.generate_content(model=MODEL, contents=contents)

    assert reply.text == ROOT_CAUSE
    assert statuses(fake) == [200, 200, 200]
    first_call = fake.requests()[1]["request"]["contents"][1]["parts"][0]
    assert ("thoughtSignature" in first_call) is signed


# The step comes from the newest signed reply


def said(reply: types.GenerateContentResponse) -> str:
    """What a reply said: its text, or the file its call reads."""
    calls = reply.function_calls or []
    return f"read_file({(calls[0].args or {})['path']})" if calls else reply.text or ""


@pytest.mark.parametrize(
    ("mode", "step", "reply"), [("required", 2, ROOT_CAUSE), ("off", 1, "read_file(b.py)")]
)
def test_a_conversation_whose_middle_was_left_out_moves_on_from_its_newest_signed_reply(
    start_fake: StartFake, client_for: ClientFor, mode: str, step: int, reply: str
) -> None:
    fake = start_fake({**SCENARIO, "thought_signatures": mode})
    client = agent_client(client_for, fake, "search")
    contents = converse(client, replies=2)

    trimmed = [contents[0], *contents[3:]]
    again = [client.models.generate_content(model=MODEL, contents=trimmed) for _ in range(2)]

    assert [entry["step"] for entry in fake.requests()] == [0, 1, step, step]
    assert [said(answer) for answer in again] == [reply, reply]
    assert statuses(fake) == [200] * 4


# Thoughts and usage


@pytest.mark.parametrize("shown", [True, False])
def test_thoughts_are_counted_always_and_sent_as_a_first_part_only_when_asked_for(
    start_fake: StartFake, client_for: ClientFor, shown: bool
) -> None:
    fake = start_fake({"agents": {"*": [{"text": "ok", "thought": THOUGHT}]}})
    client = client_for(fake)

    reply = client.models.generate_content(
        model=MODEL, contents="hi", config=SHOW_THOUGHTS if shown else None
    )

    parts = reply.candidates[0].content.parts
    thoughts = [(part.text, part.thought) for part in parts if part.thought]
    assert thoughts == ([(THOUGHT, True)] if shown else [])
    assert reply.text == "ok"
    usage = reply.usage_metadata
    assert usage.thoughts_token_count == math.ceil(len(THOUGHT) / 4)
    total = usage.prompt_token_count + usage.candidates_token_count + usage.thoughts_token_count
    assert usage.total_token_count == total
    assert fake.requests()[0]["thoughts_tokens"] == usage.thoughts_token_count


def test_the_cached_tokens_are_the_prompt_of_the_leading_contents_an_answered_request_shared(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    fake = start_fake(SCENARIO)
    client = agent_client(client_for, fake, "search")
    opening = user("Prices are off by 100x. " * 40)
    fake.set_faults([{"agent": "search", "requests": [1], "status": 503}])

    def ask(contents: list[types.Content], via: genai.Client = client) -> Any:
        return via.models.generate_content(model=MODEL, contents=contents)

    with pytest.raises(errors.ServerError):
        ask([opening])
    first = ask([opening])
    follow_up = ask([opening, first.candidates[0].content, user("And then?")])
    other_agent = ask([opening], agent_client(client_for, fake, "fanout"))

    entries = fake.requests()
    assert first.usage_metadata.cached_content_token_count is None
    assert follow_up.usage_metadata.cached_content_token_count == prompt_tokens(
        entries[2]["request"], contents=1
    )
    assert other_agent.usage_metadata.cached_content_token_count is None
    assert [entry["cached_tokens"] for entry in entries] == [
        0,
        0,
        follow_up.usage_metadata.cached_content_token_count,
        0,
    ]
    assert follow_up.usage_metadata.total_token_count == (
        follow_up.usage_metadata.prompt_token_count
        + follow_up.usage_metadata.candidates_token_count
        + follow_up.usage_metadata.thoughts_token_count
    )


def test_a_streamed_text_reply_thinks_first_and_signs_its_last_chunk(
    start_fake: StartFake, client_for: ClientFor
) -> None:
    reply = "The price is divided by 100 twice. " * 3
    fake = start_fake({"agents": {"*": [{"text": reply, "thought": THOUGHT}]}})
    client = client_for(fake)

    async def stream() -> list[types.GenerateContentResponse]:
        chunks = await client.aio.models.generate_content_stream(
            model=MODEL, contents="hi", config=SHOW_THOUGHTS
        )
        return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())

    parts = [chunk.candidates[0].content.parts[0] for chunk in chunks]
    assert (parts[0].text, parts[0].thought) == (THOUGHT, True)
    assert "".join(part.text or "" for part in parts[1:]) == reply
    assert [bool(part.thought_signature) for part in parts] == [False] * (len(parts) - 1) + [True]
    thoughts = math.ceil(len(THOUGHT) / 4)
    assert {chunk.usage_metadata.thoughts_token_count for chunk in chunks} == {thoughts}

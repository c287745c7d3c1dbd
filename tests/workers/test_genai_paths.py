"""`workers.genai_paths`: google-genai's request building gives the same JSON, byte for byte,
with the path lookup that does not walk pydantic models, for every kind of request Baton sends
and for the lookups' edge cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google import genai
from google.genai import _common, types
from google.genai import models as genai_models
from pydantic import BaseModel

from workers import genai_paths

ORIGINAL = _common.get_value_by_path


class Reply(BaseModel):
    summary: str
    files: list[str]


def _function_turns() -> list[types.Content]:
    """A tool round as Gemini 3 returns it: a thought, a signed call, then its response."""
    call = types.Part(
        function_call=types.FunctionCall(name="read_file", args={"path": "a.py"}, id="c1"),
        thought_signature=b"\x00signed\xff",
    )
    return [
        types.Content(role="user", parts=[types.Part(text="Fix it.\nline two")]),
        types.Content(role="model", parts=[types.Part(text="thinking", thought=True), call]),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(
                        name="read_file", id="c1", response={"result": "x = 1\ny = 2\n"}
                    )
                )
            ],
        ),
    ]


TOOL = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="read_file",
            description="Read a file.",
            parameters=types.Schema(
                type=types.Type.OBJECT,
                properties={"path": types.Schema(type=types.Type.STRING)},
                required=["path"],
            ),
        )
    ]
)

REQUESTS: dict[str, dict[str, Any]] = {
    "text as a string, no config": {"contents": "Do the triage stage now.", "config": None},
    "JSON reply with a system instruction": {
        "contents": [types.Content(role="user", parts=[types.Part(text="Do it.")])],
        "config": types.GenerateContentConfig(
            system_instruction="You are a stage.\n\nReply with JSON.",
            response_mime_type="application/json",
            http_options=types.HttpOptions(headers={"x-goog-api-client": "adk"}),
        ),
    },
    "a signed function call and its response, with tools": {
        "contents": _function_turns(),
        "config": types.GenerateContentConfig(
            tools=[TOOL],
            temperature=0.2,
            max_output_tokens=512,
            thinking_config=types.ThinkingConfig(include_thoughts=True),
            safety_settings=[
                types.SafetySetting(
                    category=types.HarmCategory.HARM_CATEGORY_HARASSMENT,
                    threshold=types.HarmBlockThreshold.BLOCK_ONLY_HIGH,
                )
            ],
        ),
    },
    "a response schema": {
        "contents": "Summarise.",
        "config": types.GenerateContentConfig(
            response_mime_type="application/json", response_schema=Reply
        ),
    },
    "contents given as dicts": {
        "contents": [{"role": "user", "parts": [{"text": "hi"}, {"inline_data": None}]}],
        "config": {"candidate_count": 1, "stop_sequences": ["END"]},
    },
    "a field the Gemini API refuses": {
        "contents": "Hi.",
        "config": types.GenerateContentConfig(labels={"team": "baton"}),
    },
}


def _built(
    convert: Callable[..., dict[str, Any]], client: genai.Client, request: dict[str, Any]
) -> dict[str, Any] | str:
    params = types._GenerateContentParameters(model="gemini-3-flash-preview", **request)
    try:
        return convert(client._api_client, params)
    except ValueError as exc:  # the same refusal, with the same words
        return f"ValueError: {exc}"


@pytest.mark.parametrize("name", REQUESTS)
@pytest.mark.parametrize("api", ["mldev", "vertex"])
def test_requests_are_built_exactly_as_google_genai_builds_them(
    name: str, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    convert = getattr(genai_models, f"_GenerateContentParameters_to_{api}")
    client = (
        genai.Client(api_key="k")
        if api == "mldev"
        else genai.Client(vertexai=True, project="p", location="us-central1")
    )
    monkeypatch.setattr(genai_models, "getv", ORIGINAL)
    expected = _built(convert, client, REQUESTS[name])
    monkeypatch.setattr(genai_models, "getv", genai_paths.get_value_by_path)
    assert _built(convert, client, REQUESTS[name]) == expected


CONFIG = types.GenerateContentConfig(
    system_instruction="s", stop_sequences=[], temperature=0.0, tools=[TOOL]
)
LOOKUPS: list[tuple[Any, list[str]]] = [
    (CONFIG, ["_self"]),
    (CONFIG, ["system_instruction"]),
    (CONFIG, ["temperature"]),  # a falsy value is returned, not the default
    (CONFIG, ["stop_sequences"]),
    (CONFIG, ["top_k"]),  # None
    (CONFIG, ["no_such_field"]),
    (CONFIG, ["tools[]", "function_declarations"]),  # list paths on a model: the default
    (CONFIG, ["tools[0]", "function_declarations"]),
    (CONFIG, ["tools"]),
    (TOOL, ["function_declarations"]),
    (CONFIG, ["temperature", "real"]),  # a path through a non-model value
    (CONFIG, ["stop_sequences", "x"]),  # an empty value before the path ends
    ({"config": CONFIG}, ["config", "system_instruction"]),  # dict, then model
    ({"a": [{"b": 1}, {"b": 2}]}, ["a[]", "b"]),
    ({"a": [{"b": 1}]}, ["a[0]", "b"]),
    ({"a": {"b": None}}, ["a", "b"]),
    ({}, ["a"]),
    (None, ["a"]),
    ([], ["a"]),
]


@pytest.mark.parametrize(("data", "keys"), LOOKUPS, ids=lambda v: repr(v)[:40])
@pytest.mark.parametrize("default", [None, "DEFAULT"])
def test_each_lookup_answers_as_google_genai_does(data: Any, keys: list[str], default: Any) -> None:
    assert genai_paths.get_value_by_path(data, keys, default_value=default) == ORIGINAL(
        data, keys, default_value=default
    )


def test_a_worker_builds_its_requests_with_it() -> None:
    import workers.gemini  # noqa: F401  (what a worker imports to call the model)

    assert genai_models.getv is genai_paths.get_value_by_path


def test_install_leaves_a_lookup_it_does_not_know_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def theirs(data: Any, keys: list[str], *, default_value: Any = None) -> Any:
        return ORIGINAL(data, keys, default_value=default_value)

    monkeypatch.setattr(genai_models, "getv", theirs)
    assert genai_paths.install() is False
    assert genai_models.getv is theirs
    monkeypatch.setattr(genai_models, "getv", ORIGINAL)
    assert genai_paths.install() is True
    assert genai_paths.install() is True  # twice is the same as once
    assert genai_models.getv is genai_paths.get_value_by_path

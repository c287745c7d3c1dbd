"""The upstream benchmark's counting, without timing anything: a profile function sees every
call of google-genai's `get_value_by_path` and every walk it makes over a pydantic model, and
the requests it measures are the ones Baton sends (what reaches the HTTP transport)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from google.genai import _common, types

from bench import claims, upstream
from bench.docs import Source
from orchestrator.core.pipeline import StageSpec, load_pipeline

CONFIG_FIELDS = len(types.GenerateContentConfig.model_fields)
THINKING_FIELDS = len(types.ThinkingConfig.model_fields)


def stage(name: str) -> StageSpec:
    return next(s for s in load_pipeline(upstream.PIPELINE).stages if s.name == name)


def test_a_lookup_in_plain_dicts_walks_nothing() -> None:
    data = {"config": {"thinking_config": {"include_thoughts": True}}}

    with upstream.counting() as (found, _):
        value = _common.get_value_by_path(data, ["config", "thinking_config", "include_thoughts"])

    assert value is True
    assert (found.lookups, found.walks, found.fields_visited, found.walking_lookups) == (
        1,
        [],
        0,
        0,
    )


def test_a_lookup_through_nested_models_walks_every_field_of_each() -> None:
    thinking = types.ThinkingConfig(include_thoughts=True)
    config = types.GenerateContentConfig(thinking_config=thinking)

    with upstream.counting() as (found, _):
        value = _common.get_value_by_path(config, ["thinking_config", "include_thoughts"])

    assert value is True
    assert found.lookups == 1 and found.walking_lookups == 1
    assert found.walks == [(config, "thinking_config"), (thinking, "include_thoughts")]
    assert found.fields_visited == CONFIG_FIELDS + THINKING_FIELDS


def test_a_list_path_walks_a_model_for_the_list_and_each_model_in_a_list() -> None:
    parts = [types.Part(text="one"), types.Part(text="two")]
    content = types.Content(role="user", parts=parts)

    with upstream.counting() as (on_model, _):
        from_model = _common.get_value_by_path(content, ["parts[]", "text"])
    with upstream.counting() as (on_dict, _):
        from_dict = _common.get_value_by_path({"parts": parts}, ["parts[]", "text"])

    # `in` finds no field of a model, and a list path has no `getattr` to fall back on
    assert from_model is None
    assert on_model.walks == [(content, "parts")]
    assert on_model.fields_visited == len(types.Content.model_fields)
    assert from_dict == ["one", "two"]
    assert on_dict.lookups == 3  # the call, then one for each part
    assert on_dict.walks == [(parts[0], "text"), (parts[1], "text")]
    assert on_dict.walking_lookups == 2


def test_a_model_answers_in_with_false_for_its_own_fields_so_every_lookup_walks_it() -> None:
    """The finding itself: when this fails, pydantic or google-genai changed, and the
    benchmark's walks may be gone."""
    config = types.GenerateContentConfig(system_instruction="be brief")

    assert "system_instruction" not in config
    assert config.system_instruction == "be brief"


def test_counting_ends_when_stopped_and_when_its_block_ends() -> None:
    model = types.ThinkingConfig(include_thoughts=True)
    with upstream.counting() as (found, stop):
        _common.get_value_by_path(model, ["include_thoughts"])
        stop()
        _common.get_value_by_path(model, ["include_thoughts"])
    _common.get_value_by_path(model, ["include_thoughts"])

    assert (found.lookups, len(found.walks)) == (1, 1)


def count_request(name: str, steps: int) -> tuple[upstream.Lookups, upstream.Lookups, Any]:
    """Two counts of the same request built for stage `name`, and the body sent."""

    async def counts() -> tuple[upstream.Lookups, upstream.Lookups, Any]:
        transport = upstream.StopTransport()
        model = upstream.stopping_model(transport)
        try:
            request = upstream.llm_request(stage(name), steps, model.model)
            await upstream.prepare(model, request)
            first = await upstream.count(model, request, transport)
            second = await upstream.count(model, request, transport)
            return first, second, json.loads(transport.body)
        finally:
            await upstream.close_model(model)

    return asyncio.run(counts())


def test_a_tool_stage_request_walks_its_models_and_is_the_request_baton_sends() -> None:
    first, second, body = count_request("fix", steps=2)

    assert first.lookups > 0 and len(first.walks) > 0
    assert first.walking_lookups <= first.lookups
    assert (second.lookups, len(second.walks)) == (first.lookups, len(first.walks))
    fix = stage("fix")
    assert [d["name"] for d in body["tools"][0]["functionDeclarations"]] == list(fix.tools)
    assert body["systemInstruction"]["parts"][0]["text"].startswith(fix.instruction.strip())
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user", "model", "user"]
    call, answer = body["contents"][1]["parts"][0], body["contents"][2]["parts"][0]
    assert call["functionCall"]["name"] == "read_file"
    assert base64.urlsafe_b64decode(call["thoughtSignature"]) == upstream.SIGNATURE
    assert answer["functionResponse"]["response"] == {"content": upstream.FILE_TEXT}


def test_each_tool_step_adds_lookups_and_walks() -> None:
    short, _, _ = count_request("fix", steps=1)
    longer, _, _ = count_request("fix", steps=3)

    assert longer.lookups > short.lookups
    assert len(longer.walks) > len(short.walks)


def test_a_stage_without_tools_asks_for_json_and_declares_no_tools() -> None:
    found, _, body = count_request("plan", steps=0)

    assert found.lookups > 0 and found.walking_lookups <= found.lookups
    assert body["generationConfig"]["responseMimeType"] == "application/json"
    assert "tools" not in body


def test_the_section_shows_only_figures_of_its_results_file() -> None:
    figures = {
        "contents": 27, "tools": 6, "lookups": 777, "walking_lookups": 777, "walks": 777,
        "fields_visited": 11111, "build_us": 8288.7, "walks_us": 1609.6, "getattr_us": 28.1,
        "walks_share": 0.194,
    }  # fmt: skip
    source = Source(
        "bench/results/upstream.json",
        {"commit": "abc1234", "date": "2026-01-02 03:04", "took_s": 12,
         "google_genai": "2.34.0", "pydantic": "2.14.4", "python": "3.11.7",
         "pipeline": "fixer", "blocks": 15, "builds_per_block": 20, "replays_per_block": 20,
         "requests": {"fix: last call of its budget": figures}},
    )  # fmt: skip

    body = upstream.walks(source)

    assert (
        "| fix: last call of its budget | 27 | 777 | 777 | 11,111 | 8,289 | 1,610 | 19.4% | 28 |"
        in body
    )
    assert "commit abc1234, 2026-01-02 03:04" in body
    assert claims.untraced(body, [source]) == []

from __future__ import annotations

from google.adk.models.llm_request import LlmRequest
from google.genai import types

from workers.budget import (
    json_chars,
    request_tokens,
    request_trimmer,
    shrink_to_fit,
    tool_output_limiter,
)


def test_shrink_to_fit_cuts_the_longest_string_with_a_marker() -> None:
    value = {"exit_code": 1, "output": "x" * 10_000, "cmd": "pytest"}
    cut, removed = shrink_to_fit(value, 1_000)

    assert json_chars(cut) <= 1_000
    assert (cut["exit_code"], cut["cmd"]) == (1, "pytest")
    assert "…[cut " in cut["output"] and "of 10000 chars]" in cut["output"]
    assert removed == json_chars(value) - json_chars(cut)


def test_shrink_to_fit_drops_list_items_when_strings_are_short() -> None:
    value = {"matches": [f"file{i}.py:1:hit" for i in range(500)]}
    cut, _ = shrink_to_fit(value, 600)

    assert json_chars(cut) <= 600
    assert cut["matches"][0] == "file0.py:1:hit"
    assert cut["matches"][-1].startswith("…[") and "more items cut]" in cut["matches"][-1]


def test_value_within_budget_is_unchanged() -> None:
    assert shrink_to_fit({"a": "b"}, 100) == ({"a": "b"}, 0)


def test_tool_output_over_budget_is_cut_and_says_how_much() -> None:
    limiter = tool_output_limiter(2_000)
    response = {"content": "y" * 20_000}
    cut = limiter(tool=None, args={}, tool_context=None, tool_response=response)

    assert cut is not None
    assert json_chars(cut) <= 2_000 + 120
    assert cut["truncated"].startswith("tool output cut to fit the budget: ")
    assert "of 20014 chars removed" in cut["truncated"]
    assert limiter(tool=None, args={}, tool_context=None, tool_response={"ok": 1}) is None


def _call(name: str, i: int) -> types.Content:
    return types.Content(
        role="model",
        parts=[types.Part(function_call=types.FunctionCall(id=f"c{i}", name=name, args={"i": i}))],
    )


def _response(name: str, i: int, size: int) -> types.Content:
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=f"c{i}", name=name, response={"r": "z" * size}
                )
            )
        ],
    )


def test_trimming_drops_oldest_exchanges_whole_and_keeps_first_and_newest() -> None:
    first = types.Content(role="user", parts=[types.Part(text="Do the search stage now.")])
    contents = [first]
    for i in range(4):
        contents += [_call("read_file", i), _response("read_file", i, 4_000)]
    request = LlmRequest(contents=list(contents))

    request_trimmer(2_500)(callback_context=None, llm_request=request)

    kept = request.contents
    assert request_tokens(request) <= 2_500
    assert kept[0].parts[0].text == "Do the search stage now."
    assert kept[0].parts[-1].text.startswith("[Baton: left out ")
    assert (
        first.parts[-1].text == "Do the search stage now."
    )  # the session's own content is untouched
    calls = [p.function_call.id for c in kept for p in c.parts or [] if p.function_call]
    responses = [p.function_response.id for c in kept for p in c.parts or [] if p.function_response]
    assert calls == responses
    assert calls in (["c3"], ["c2", "c3"])
    assert f"left out {4 - len(calls)} earlier model turns" in kept[0].parts[-1].text


def test_trimming_keeps_the_repair_turns_message_that_starts_the_current_turn() -> None:
    first = types.Content(role="user", parts=[types.Part(text="Do the search stage now.")])
    repair = types.Content(role="user", parts=[types.Part(text="Your reply could not be used")])
    contents = [first]
    for i in range(3):
        contents += [_call("read_file", i), _response("read_file", i, 4_000)]
    contents += [types.Content(role="model", parts=[types.Part(text="{}")]), repair]
    for i in range(3, 5):  # together over the budget: one of them must go too
        contents += [_call("read_file", i), _response("read_file", i, 6_000)]
    request = LlmRequest(contents=list(contents))

    request_trimmer(2_500)(callback_context=None, llm_request=request)

    texts = [p.text for c in request.contents for p in c.parts or [] if p.text]
    assert "Your reply could not be used" in texts
    calls = [p.function_call.id for c in request.contents for p in c.parts or [] if p.function_call]
    assert calls == ["c4"]  # the repair message stayed; an older call went instead
    assert request_tokens(request) <= 2_500


def test_trimming_leaves_small_requests_alone() -> None:
    contents = [
        types.Content(role="user", parts=[types.Part(text="hi")]),
        _call("f", 0),
        _response("f", 0, 10),
    ]
    request = LlmRequest(contents=list(contents))
    request_trimmer(10_000)(callback_context=None, llm_request=request)
    assert request.contents == contents

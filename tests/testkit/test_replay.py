"""Turning a run's audit log into the scenario that replays one execution's model replies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.replay import ReplayError, Turn, script

SESSION = "run-1:fix:2"


def entry(kind: str, parts: list[dict[str, Any]], *, author: str = "fix",
          session: str = SESSION) -> dict[str, str]:  # fmt: skip
    content = {"role": "model", "parts": parts}
    return {"session": session, "kind": kind, "author": author,
            "data": json.dumps({"content": content, "usage": None, "error": None})}  # fmt: skip


def test_the_replies_of_one_execution_become_each_agents_steps_in_order() -> None:
    read = {"function_call": {"name": "read_file", "args": {"path": "a.py"}, "id": "x1"}}
    diff = {"function_call": {"name": "show_diff", "args": {}}}
    entries = [
        entry("user_message", [{"text": "the instruction"}], author="user"),
        entry("tool_call", [{"text": "planning", "thought": True}, read]),
        entry("tool_result", [{"function_response": {"name": "read_file", "response": {}}}]),
        entry("tool_call", [read, diff]),
        entry("model_reply", [{"text": "ignored", "thought": True}, {"text": '{"summary": "x"}'}]),
        entry("model_reply", [{"text": '{"summary": "short"}'}], author="compactor"),
        entry("model_reply", [{"text": "another attempt"}], session="run-1:fix:1"),
    ]

    scenario = script(entries, SESSION)

    assert scenario["agents"] == {
        "fix": {"steps": [
            {"call": {"name": "read_file", "args": {"path": "a.py"}}},
            {"calls": [{"name": "read_file", "args": {"path": "a.py"}},
                       {"name": "show_diff", "args": {}}]},
            {"text": '{"summary": "x"}'},
        ]},
        "compactor": {"steps": [{"text": '{"summary": "short"}'}]},
    }  # fmt: skip
    assert scenario["turns"] == [
        Turn("fix", "call read_file"),
        Turn("fix", "call read_file, show_diff"),
        Turn("fix", 'text: {"summary": "x"}'),
        Turn("compactor", 'text: {"summary": "short"}'),
    ]


def test_an_execution_with_no_reply_on_record_cannot_be_replayed() -> None:
    with pytest.raises(ReplayError, match="no model reply of run-1:fix:3"):
        script([entry("model_reply", [{"text": "x"}])], "run-1:fix:3")

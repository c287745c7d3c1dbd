"""Finding one stage's traffic in another stage's model requests, from the fake server's log.

A stage's *traffic* is every string in its function calls and function responses (the tool
outputs), line by line. It can reach another stage's request in two shapes, and both are
looked for:

* as text: ADK renders another agent's events as user text ("[search] `read_file` tool
  returned result: {'content': '  1| ...\\n  2| ...'}"), with the tool output as a Python repr
  inside JSON, so its lines arrive escaped and glued together. Lines are therefore compared
  as runs of letters, digits and underscores: escapes, quotes and punctuation cannot hide one.
  Text a stage may legitimately hold (the upstream outputs it references, the issue) is left
  out;
* as parts: every `functionCall` part of a stage's request must be a call its own script made,
  and every `functionResponse` part must answer a call in the model turn just before it.

A stage's static instruction lines are looked for anywhere in every other stage's requests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_LINE_CHARS = 25
"""Shorter lines (once reduced to words) are too common to say where they came from."""
_WORD = re.compile(r"[A-Za-z0-9_]+")

Request = Mapping[str, Any]


@dataclass(frozen=True)
class Leak:
    owner: str
    """The stage whose traffic or instruction it was."""
    seen_by: str
    """The stage whose request held it."""
    kind: str
    """`tool traffic`, `instruction`, `function call part` or `function response part`."""
    sample: str


def words(text: str) -> str:
    """`text` as its runs of letters, digits and underscores, one space apart."""
    return " ".join(_WORD.findall(text))


def strings(value: Any) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in strings(v)]
    if isinstance(value, list):
        return [t for v in value for t in strings(v)]
    return []


def parts(request: Request) -> list[dict[str, Any]]:
    """Every part of the request's contents."""
    return [
        part for content in request.get("contents") or [] for part in content.get("parts") or []
    ]


def traffic_lines(requests: Iterable[Request]) -> set[str]:
    """The lines of every string in the requests' function calls and responses, as words."""
    found = set()
    for request in requests:
        for part in parts(request):
            for key in ("functionCall", "functionResponse"):
                for text in strings(part.get(key)):
                    found |= {w for w in map(words, text.splitlines()) if len(w) >= MIN_LINE_CHARS}
    return found


def text_view(request: Request) -> str:
    """What a request says in text: its system instruction and its text parts, as words."""
    texts = strings(request.get("systemInstruction"))
    texts += [part["text"] for part in parts(request) if isinstance(part.get("text"), str)]
    return words("\n".join(texts))


def call_key(call: Mapping[str, Any]) -> str:
    return json.dumps([call.get("name"), call.get("args") or {}], sort_keys=True)


def scripted_calls(scenario: Mapping[str, Any], agent: str) -> set[str]:
    """The function calls the fake server's script has `agent` make."""
    script = scenario["agents"].get(agent, [])
    steps = script["steps"] if isinstance(script, dict) else script
    calls = [c for step in steps for c in ([step["call"]] if "call" in step else [])]
    calls += [c for step in steps for c in step.get("calls", [])]
    return {call_key(call) for call in calls}


def foreign_parts(requests: Sequence[Request], own_calls: set[str]) -> list[tuple[str, str]]:
    """(kind, sample) for each function part that is not the stage's own: a call its script
    never made, or a response that answers no call of the model turn before it."""
    found = []
    for request in requests:
        called: set[str] = set()
        for content in request.get("contents") or []:
            content_parts = content.get("parts") or []
            calls = [part["functionCall"] for part in content_parts if "functionCall" in part]
            found += [("function call part", call_key(c)) for c in calls
                      if call_key(c) not in own_calls]  # fmt: skip
            responses = [p["functionResponse"] for p in content_parts if "functionResponse" in p]
            found += [("function response part", str(r.get("name"))) for r in responses
                      if r.get("name") not in called]  # fmt: skip
            if content.get("role") == "model":
                called = {str(call.get("name")) for call in calls}
    return found


def find_leaks(
    requests: Mapping[str, Sequence[Request]],
    *,
    own_calls: Mapping[str, set[str]],
    allowed: Mapping[str, str],
    instructions: Mapping[str, str] | None = None,
) -> list[Leak]:
    """Every leak between the stages' requests (`requests`: stage → its requests).

    `own_calls`: stage → the calls its script makes (`scripted_calls`). `allowed`: stage →
    text it may hold whatever its origin (the outputs it references, the issue). `instructions`:
    stage → its instruction template, whose lines without placeholders no other stage may see.
    """
    leaks = []
    traffic = {stage: traffic_lines(reqs) for stage, reqs in requests.items()}
    for seen_by, reqs in requests.items():
        allowed_words = words(allowed.get(seen_by, ""))
        views = [text_view(r) for r in reqs]
        whole = [words(json.dumps(r)) for r in reqs]
        leaks += [
            Leak(caller(sample, own_calls), seen_by, kind, sample)
            for kind, sample in foreign_parts(reqs, own_calls.get(seen_by, set()))
        ]
        for owner in requests:
            if owner == seen_by:
                continue
            for line in sorted(traffic[owner]):
                if line not in allowed_words and any(line in view for view in views):
                    leaks.append(Leak(owner, seen_by, "tool traffic", line))
            for line in instruction_lines((instructions or {}).get(owner, "")):
                if any(line in view for view in whole):
                    leaks.append(Leak(owner, seen_by, "instruction", line))
    return leaks


def caller(call: str, own_calls: Mapping[str, set[str]]) -> str:
    """The stage whose script makes `call` (a `call_key`), or "?"."""
    return next((stage for stage, calls in own_calls.items() if call in calls), "?")


def instruction_lines(instruction: str) -> list[str]:
    """The lines of an instruction template that hold no placeholder, as words."""
    lines = [words(line) for line in instruction.splitlines() if "{" not in line]
    return [line for line in lines if len(line) >= MIN_LINE_CHARS]

"""What the fake Gemini server says: a scripted policy per agent, fault rules and latency.

A scenario is JSON::

    {"agents": {
        "search": {"steps": [
            {"call": {"name": "search_code", "args": {"pattern": "average_price_cents"}}},
            {"calls": [{"name": "read_file", "args": {"path": "a.py"}},
                       {"name": "read_file", "args": {"path": "b.py"}}]},
            {"json": {"root_cause": "..."}}
        ]},
        "*": [{"text": "ok"}]
     },
     "thought_signatures": "required",
     "faults": [{"agent": "search", "requests": [1], "status": 429, "retry_delay_s": 3}],
     "quota": {"requests_per_minute": 60, "tokens_per_minute": 100000, "window_s": 60},
     "latency_ms": 0}

Agents. The agent of a request is the name ADK puts in the system instruction, else the
`x-baton-agent` header, else `"default"`; an agent with no script plays `"*"`. A script is
`{"steps": [...]}` or just the list. Each step is exactly one of `text` (a text reply), `json`
(a text reply holding that value as JSON), `call` (one function call), `calls` (several
function calls in one reply) or `extract` (a summariser's reply, below), and may set `thought`,
its thought summary (default: "I will call NAME, NAME." or "I will answer in text."). Past the
end of the script the last step
repeats. A script may have `"variants": [{"when": TEXT, "steps": [...]}]`: a request whose
system instruction holds TEXT plays the first such variant's steps instead (a looped stage's
second iteration, whose instruction tells of the first, gets other replies). In a `text` or
`json` step, `{{fn:NAME.FIELD}}` is replaced by FIELD of the newest response of function NAME in
the request (e.g. the commit a tool made).

Summaries. `{"extract": "FACT:"}` plays a summariser with a deterministic, extractive policy:
the reply is every line of the request's text parts (its contents', not its system
instruction's) that holds the marker, from the marker to the end of the line, each once, in
order; "(no line holds FACT:)" when none does. What such a reply says therefore came from the
request and nowhere else: a test can follow a fact from a tool's result, through the summary a
client asked for, into a later request.

Steps. The step a request gets depends on its contents alone, so a retried or redelivered
request replays the same step: one past the step of its newest model content that carries a
signature this server issued for it, plus the model contents after that one; without one, the
number of `role: "model"` contents. A conversation whose middle the client left out (to fit a
token budget, say) so moves on from where its newest signed reply was.

Thinking. Like Gemini 3, the model thinks before every reply: the thought summary's tokens are
counted as `thoughtsTokenCount`, and the summary itself is sent as a first `thought` part only
when the request sets `generationConfig.thinkingConfig.includeThoughts` (`tokens` has every
count). `thought_signatures` says what the server does with signatures (see `signatures`):

* `"required"` (the default, Gemini 3): replies carry them, and a request whose current turn
  holds a function call without its signature, or with one altered or not issued by this
  server, is refused with 400 `INVALID_ARGUMENT` before the quota and the fault rules see it;
* `"optional"` (Gemini 2.5): replies carry them, nothing is checked;
* `"off"`: replies carry none, nothing is checked.

Quota. With `quota`, each model has a sliding window (`window_s`, default 60) over the
requests it answered with 200, counted from when they arrived: a request that would take the
window past `requests_per_minute`, or whose prompt tokens would take it past
`tokens_per_minute` (prompt plus reply tokens of the answered ones), is refused with a 429
whose `RetryInfo.retryDelay` is the time until the window has room, rounded up to 0.1 s. Either
limit may be left out. With `"window": "fixed"` the windows are fixed instead, one after the
other from the epoch (minute windows start on the clock's minutes), and a 429's delay is the time
until the current one ends. The quota is checked before the fault rules: a request it refuses is
recorded with status 429 and never reaches them (their counters do not see it).

Faults. Rules are checked in order for every model request and the first that matches applies.
Selectors: `agent` (default `"*"`, any agent), `requests` (1-based numbers of that agent's
requests since the last reset), `every` (every Nth request of that agent), `times` (apply at
most this many times in all). `scope` says what `requests` and `every` count: `"agent"` (the
default) the requests of the request's own agent, `"all"` the requests of every agent together,
so `{"every": 2, "scope": "all", "status": 429}` refuses half of all calls. Effects:

* `status`: answer with an error status from `wire.ERRORS`. For 429, `retry_delay_s` puts a
  `RetryInfo` in the body (default 1 s, `null` for none). `retry_after_s` adds a `Retry-After`
  header (whole seconds, rounded up).
* `drop`: close the connection without a complete reply.
* `latency_ms`: wait first (also a scenario-wide default); alone, it delays a normal reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from testkit.gemini import wire
from testkit.gemini.tokens import compact_json

ANY_AGENT = "*"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionCall(_Model):
    """A function call the model makes."""

    name: str
    """Name of the tool to call."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the call."""


class Step(_Model):
    """One scripted reply: exactly one of `text`, `json`, `call`, `calls` or `extract`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    text: str | None = None
    """A text reply."""
    json_value: Any = Field(None, alias="json")
    """A text reply holding this value serialized as JSON (not `null`)."""
    call: FunctionCall | None = None
    """A reply with one function call."""
    calls: list[FunctionCall] | None = Field(None, min_length=1)
    """A reply with several function calls."""
    extract: str | None = Field(None, min_length=1)
    """A text reply of the request's lines that hold this marker (see the module docstring)."""
    thought: str | None = None
    """The thought summary of this step; None: one sentence saying what the reply does."""

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Step:
        values = {
            "text": self.text,
            "json": self.json_value,
            "call": self.call,
            "calls": self.calls,
            "extract": self.extract,
        }
        given = [kind for kind, value in values.items() if value is not None]
        if len(given) != 1:
            named = ", ".join(given) or "none"
            raise ValueError(
                f"a step is exactly one of text, json, call, calls, extract (given: {named})"
            )
        return self

    def parts(self, request: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """The reply's `parts` in the wire format (fresh objects on every call); an `extract`
        step's are drawn from `request`, the body it answers."""
        if self.extract is not None:
            return [{"text": extracted_lines(request or {}, self.extract)}]
        if self.json_value is not None:
            return [{"text": compact_json(self.json_value)}]
        if self.text is not None:
            return [{"text": self.text}]
        return [{"functionCall": call.model_dump()} for call in self._calls()]

    def thought_summary(self) -> str:
        """What the model thought before this reply."""
        if self.thought is not None:
            return self.thought
        names = [call.name for call in self._calls()]
        return f"I will call {', '.join(names)}." if names else "I will answer in text."

    def _calls(self) -> list[FunctionCall]:
        return [self.call] if self.call is not None else (self.calls or [])


def extracted_lines(request: Mapping[str, Any], marker: str) -> str:
    """The lines of the request's text parts that hold `marker`, each from the marker on,
    once, in order."""
    found: dict[str, None] = {}
    for content in request.get("contents") or []:
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            text = part.get("text") if isinstance(part, dict) and not part.get("thought") else None
            for line in text.splitlines() if isinstance(text, str) else []:
                if marker in line:
                    found[line[line.index(marker) :].strip()] = None
    return "\n".join(found) or f"(no line holds {marker})"


class Variant(_Model):
    """Other replies for the agent's sessions whose system instruction holds `when`."""

    when: str = Field(min_length=1)
    steps: list[Step] = Field(min_length=1)


class AgentScript(_Model):
    """The replies one agent gets, by step."""

    steps: list[Step] = Field(min_length=1)
    """Replies in order; the last one repeats."""
    variants: list[Variant] = Field(default_factory=list)
    """Checked in order: the first whose `when` the request's system instruction holds plays
    its steps instead (a looped stage's second iteration, told of its first, say)."""

    @model_validator(mode="before")
    @classmethod
    def _accept_bare_list(cls, data: Any) -> Any:
        return {"steps": data} if isinstance(data, list) else data

    def step(self, index: int, system: str = "") -> Step:
        """The reply for step `index` (0-based) of a session whose system instruction is
        `system`; past the end, the last step."""
        steps = next((v.steps for v in self.variants if v.when in system), self.steps)
        return steps[min(index, len(steps) - 1)]


class FaultRule(_Model):
    """A fault to inject into matching requests (see the module docstring)."""

    agent: str = ANY_AGENT
    """Agent the rule applies to; `"*"` means any."""
    requests: list[PositiveInt] | None = None
    """1-based numbers of the agent's requests since the last reset."""
    every: PositiveInt | None = None
    """Apply to every Nth request of the agent."""
    scope: Literal["agent", "all"] = "agent"
    """What `requests` and `every` count: the agent's requests, or all requests together."""
    times: PositiveInt | None = None
    """Apply at most this many times in all."""
    status: int | None = None
    """HTTP error status to answer with."""
    retry_delay_s: NonNegativeFloat | None = 1.0
    """For 429: the `RetryInfo.retryDelay` in the body; `None` leaves `RetryInfo` out."""
    retry_after_s: NonNegativeFloat | None = None
    """A `Retry-After` header, in whole seconds (rounded up)."""
    drop: bool = False
    """Close the connection without a complete reply."""
    latency_ms: NonNegativeInt | None = None
    """Wait this long before answering; replaces the scenario's `latency_ms`."""

    @model_validator(mode="after")
    def _has_one_effect(self) -> FaultRule:
        if self.status is not None and self.status not in wire.ERRORS:
            raise ValueError(f"status {self.status} is not one of {sorted(wire.ERRORS)}")
        if self.status is not None and self.drop:
            raise ValueError("a rule either answers with a status or drops, not both")
        if self.status is None and not self.drop and self.latency_ms is None:
            raise ValueError("a rule needs an effect: status, drop or latency_ms")
        return self

    def selects(self, agent: str, agent_number: int, overall_number: int) -> bool:
        """Whether a request matches (ignoring `times`): the agent's `agent_number`-th request,
        and the `overall_number`-th of all."""
        if self.agent not in (ANY_AGENT, agent):
            return False
        number = overall_number if self.scope == "all" else agent_number
        if self.requests is not None and number not in self.requests:
            return False
        return self.every is None or number % self.every == 0


class Quota(_Model):
    """A model's quota over what it answered (see the module docstring); None: no limit."""

    requests_per_minute: PositiveInt | None = None
    """Requests answered per window."""
    tokens_per_minute: PositiveInt | None = None
    """Prompt plus reply tokens of the requests answered per window."""
    window_s: PositiveFloat = 60.0
    """Length of the window."""
    window: Literal["sliding", "fixed"] = "sliding"
    """`sliding`: the `window_s` before each request; `fixed`: windows of `window_s` in a row."""


class Scenario(_Model):
    """Everything the fake server plays."""

    agents: dict[str, AgentScript] = Field(default_factory=dict)
    """Script per agent name; `"*"` serves agents without one."""
    thought_signatures: Literal["required", "optional", "off"] = "required"
    """Signatures issued and checked (Gemini 3), issued only (Gemini 2.5), or neither."""
    faults: list[FaultRule] = Field(default_factory=list)
    """Fault rules, first match wins."""
    quota: Quota | None = None
    """Each model's quota; None: no limit."""
    latency_ms: NonNegativeInt = 0
    """Delay before every reply unless a matching rule sets its own."""

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """Read and validate a scenario JSON file."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def script_for(self, agent: str) -> AgentScript | None:
        """The agent's script, else the `"*"` script, else `None`."""
        return self.agents.get(agent) or self.agents.get(ANY_AGENT)

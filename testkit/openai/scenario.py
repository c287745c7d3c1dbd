"""What the fake OpenAI-compatible server says: a scripted policy per agent, and faults.

A scenario is JSON::

    {"agents": {
        "triage": {"steps": [{"json": {"actionable": true, ...}}]},
        "search": [{"call": {"name": "read_file", "args": {"path": "a.py"}}}, {"text": "done"}],
        "*": [{"text": "ok"}]
     },
     "faults": [{"agent": "triage", "requests": [1], "status": 429, "retry_after_s": 3}]}

Agents and steps are the fake Gemini's (`testkit.gemini.scenario`): the agent of a request is
the name ADK puts in its system message, else the `x-baton-agent` header, else `"default"`; an
agent without a script plays `"*"`. The step of a request is the number of `assistant`
messages in it (an OpenAI-compatible API keeps no state, and a retried request replays its
step); past the end of the script the last step repeats. Each step's thought summary is the
model's reasoning: counted as `reasoning_tokens`, never sent.

Faults are checked in order for every request, the first that matches applies: `agent`
(default `"*"`), `requests` (1-based numbers of that agent's requests since the last reset),
`times` (at most this many times in all). Each answers with `status` (`wire.ERRORS`), and a 429
with the headers the rule names (`ChatFault`): the shapes of OpenAI's rate-limit signals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveInt,
    model_validator,
)

from testkit.gemini.scenario import ANY_AGENT, AgentScript
from testkit.openai import wire


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatFault(_Model):
    """An error to answer matching requests with, and the rate-limit headers of a 429."""

    agent: str = ANY_AGENT
    """Agent the rule applies to; `"*"` means any."""
    requests: list[PositiveInt] | None = None
    """1-based numbers of the agent's requests since the last reset."""
    times: PositiveInt | None = None
    """Apply at most this many times in all."""
    status: int
    """HTTP status to answer with (`wire.ERRORS`)."""
    retry_after_s: NonNegativeFloat | None = None
    """`Retry-After` in seconds (written as an integer when it is one)."""
    retry_after_date: bool = False
    """Write `Retry-After` as the HTTP date `retry_after_s` from now instead."""
    retry_after_ms: NonNegativeFloat | None = None
    """`retry-after-ms`."""
    reset_requests: str | None = Field(None, pattern=r"^[0-9.hms]+$")
    """`x-ratelimit-reset-requests`, a duration as OpenAI writes it: `1s`, `6m0s`, `20ms`."""
    reset_tokens: str | None = Field(None, pattern=r"^[0-9.hms]+$")
    """`x-ratelimit-reset-tokens`."""
    exhausted: Literal["requests", "tokens"] = "requests"
    """The limit that ran out: its `x-ratelimit-remaining-…` is 0, the other's is not."""

    @model_validator(mode="after")
    def _known_status(self) -> ChatFault:
        if self.status not in wire.ERRORS:
            raise ValueError(f"status {self.status} is not one of {sorted(wire.ERRORS)}")
        if self.retry_after_date and self.retry_after_s is None:
            raise ValueError("retry_after_date needs retry_after_s")
        return self

    def selects(self, agent: str, agent_number: int, overall_number: int) -> bool:
        """Whether a request matches (ignoring `times`): the agent's `agent_number`-th."""
        if self.agent not in (ANY_AGENT, agent):
            return False
        return self.requests is None or agent_number in self.requests


class ChatScenario(_Model):
    """Everything the fake OpenAI-compatible server plays."""

    agents: dict[str, AgentScript] = Field(default_factory=dict)
    """Script per agent name; `"*"` serves agents without one."""
    faults: list[ChatFault] = Field(default_factory=list)
    """Fault rules, first match wins."""

    @classmethod
    def load(cls, path: str | Path) -> ChatScenario:
        """Read and validate a scenario JSON file."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def script_for(self, agent: str) -> AgentScript | None:
        """The agent's script, else the `"*"` script, else `None`."""
        return self.agents.get(agent) or self.agents.get(ANY_AGENT)

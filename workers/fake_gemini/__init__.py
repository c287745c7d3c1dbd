"""A fake Gemini REST server that ships with Baton: tests and the offline demo run the real
google-genai client (and ADK) against it.

It plays a scripted reply per agent and step, enforces a per-model quota (429 with
`RetryInfo`), injects faults (429, 5xx, 4xx, dropped connections, latency) and records every
request. See `scenario` for the format,
`tokens` for how tokens are counted, `server` for the endpoints and `harness` for running it.
"""

from workers.fake_gemini.harness import FakeGemini
from workers.fake_gemini.scenario import (
    AgentScript,
    FaultRule,
    FunctionCall,
    Quota,
    Scenario,
    Step,
)
from workers.fake_gemini.server import create_app

__all__ = [
    "AgentScript",
    "FakeGemini",
    "FaultRule",
    "FunctionCall",
    "Quota",
    "Scenario",
    "Step",
    "create_app",
]

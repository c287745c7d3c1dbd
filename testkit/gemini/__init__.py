"""A fake Gemini REST server that ships with Baton: tests and the offline demo run the real
google-genai client (and ADK) against it.

It speaks like the strictest current model (Gemini 3): it plays a scripted reply per agent and
step, signs its replies with thought signatures and refuses a current turn that drops or alters
one (400), reports thoughts and implicitly cached tokens, enforces a per-model quota (429 with
`RetryInfo`), injects faults (429, 5xx, 4xx, dropped connections, latency) and records every
request. See `scenario` for the format, `signatures` for the signatures, `tokens` for how tokens
are counted, `wire` for the replies, `server` for the endpoints and `harness` for running it.
"""

from testkit.gemini.harness import FakeGemini
from testkit.gemini.scenario import (
    AgentScript,
    FaultRule,
    FunctionCall,
    Quota,
    Scenario,
    Step,
)
from testkit.gemini.server import create_app

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

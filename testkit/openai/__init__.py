"""A fake OpenAI-compatible chat-completions server: tests run LiteLLM's real client (through
ADK's `LiteLlm`, as Baton's `openai/…` and `hosted_vllm/…` stages do) against it.

It plays a scripted reply per agent and step as the fake Gemini does (`scenario`), answers in
OpenAI's wire format with tool calls and usage (`wire`), checks the API key without ever
recording it, injects 429s with OpenAI's rate-limit headers and other errors, and records every
request (`server`).
"""

from testkit.openai.scenario import ChatFault, ChatScenario
from testkit.openai.server import FakeOpenAI, create_app

__all__ = ["ChatFault", "ChatScenario", "FakeOpenAI", "create_app"]

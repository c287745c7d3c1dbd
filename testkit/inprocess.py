"""The fake server inside the test's own process: the real google-genai client reaches it
through httpx's ASGI transport, so a unit test exercises the real client, the real wire format
and the fake's rules without a socket, a thread or a network.

    fake = InProcessGemini({"agents": {"triage": [{"json": {...}}]}})
    model = fake.model()              # a `BatonGemini`, as a worker builds it
    ... run a stage with `model` ...
    assert [e["agent"] for e in fake.requests()] == ["triage"]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import SecretStr

from orchestrator.core.settings import ModelConfig, RetryConfig
from testkit.gemini.ledger import Ledger
from testkit.gemini.scenario import Scenario
from testkit.gemini.server import create_app
from workers.gemini import BatonGemini, build_model

BASE_URL = "http://fake-gemini.invalid"
"""The base URL the client is given; no request ever leaves the process."""
API_KEY = "in-process-key"
MODEL = "gemini-test"
"""The model name a test's requests carry, unless it names one."""


class InProcessGemini:
    """A fake Gemini server as an ASGI app in this process, and models that talk to it."""

    def __init__(self, scenario: Scenario | Mapping[str, Any] | None = None) -> None:
        self.ledger = Ledger()
        self.app = create_app(Scenario.model_validate(scenario or {}), ledger=self.ledger)

    def http_client(self) -> httpx.AsyncClient:
        """An HTTP client whose requests this process's fake server answers."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL)

    def model(self, name: str = MODEL, **retry: Any) -> BatonGemini:
        """A model as a worker builds it (`workers.gemini.build_model`), on this server;
        `retry` overrides `RetryConfig` fields (fewer transient attempts, say)."""
        config = ModelConfig(name=name, base_url=BASE_URL, api_key=SecretStr(API_KEY))
        return build_model(config, RetryConfig(**retry), http_client=self.http_client())

    def requests(self) -> list[dict[str, Any]]:
        """The recorded requests, oldest first (see `testkit.gemini.ledger`)."""
        return self.ledger.entries()

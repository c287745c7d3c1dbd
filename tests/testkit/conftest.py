"""Fixtures of the fake Gemini tests: servers that stop with the test, and real google-genai
clients pointed at them.

pytest's main process imports this module too (it loads the conftest of every `test*` folder
of `tests` before collecting), and under xdist it only hands tests to its workers: the fixtures
import the fake and google-genai when first used, which spares it a second of start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from google import genai

    from testkit.gemini import FakeGemini

StartFake = Callable[..., "FakeGemini"]
ClientFor = Callable[..., "genai.Client"]


@pytest.fixture
def start_fake() -> Iterator[StartFake]:
    """Start fake servers (`start_fake(scenario, record_path=...)`); all stop when the test
    ends."""
    from testkit.gemini import FakeGemini

    with ExitStack() as stack:

        def start(scenario: dict[str, Any], **kwargs: Any) -> FakeGemini:
            return stack.enter_context(FakeGemini.start(scenario, **kwargs))

        yield start


@pytest.fixture
def client_for() -> ClientFor:
    """A google-genai client for a fake server, with the client's own retries off and the
    process's one TLS context, as a worker makes it (`workers.gemini.build_model`): left alone,
    each client loads the CA bundle twice, a tenth of a second."""
    import httpx
    from google import genai
    from google.genai import types

    from workers.gemini import tls_context

    def client(
        fake: FakeGemini, api_key: str = "fake-key", headers: dict[str, str] | None = None
    ) -> genai.Client:
        tls = tls_context()
        options = types.HttpOptions(
            base_url=fake.url,
            api_version="v1beta",
            headers=headers,
            retry_options=types.HttpRetryOptions(attempts=1),
            client_args={"verify": tls},
            async_client_args={
                "verify": tls,
                "ssl": tls,
                "transport": httpx.AsyncHTTPTransport(verify=tls),
            },
        )
        return genai.Client(api_key=api_key, http_options=options)

    return client

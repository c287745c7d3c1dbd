"""Running the fake server (in a thread or as a process) and driving its admin endpoints.

with FakeGemini.start(scenario) as fake:
    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=fake.url))
    ...
    assert [entry["step"] for entry in fake.requests()] == [0, 1]
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from testkit.gemini.scenario import FaultRule, Scenario
from testkit.gemini.server import create_app

ADMIN_TIMEOUT_S = 10.0
"""Timeout of one admin request."""


class FakeGemini:
    """A running fake server: its base URL and its admin endpoints.

    `FakeGemini.start(...)` runs one in a background thread; `FakeGemini(url)` attaches to one
    running elsewhere (a `python -m testkit.gemini` process).
    """

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    @classmethod
    @contextmanager
    def start(
        cls,
        scenario: Scenario | Mapping[str, Any] | None = None,
        *,
        record_path: str | Path | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 10.0,
    ) -> Iterator[FakeGemini]:
        """Serve `scenario` on a free port of `host` until the block ends."""
        app = create_app(Scenario.model_validate(scenario or {}), record_path=record_path)
        with serve_in_thread(app, "fake Gemini", host=host, timeout_s=startup_timeout_s) as url:
            yield cls(url)

    def requests(self) -> list[dict[str, Any]]:
        """The entries recorded since the last reset, oldest first."""
        response = self._admin("GET", "/_fake/requests")
        entries: list[dict[str, Any]] = response.json()
        return entries

    def reset(self) -> None:
        """Forget recorded entries, restart the request counters and empty the quota windows."""
        self._admin("POST", "/_fake/reset")

    def set_faults(self, rules: Iterable[FaultRule | Mapping[str, Any]]) -> None:
        """Replace the fault rules."""
        validated = [FaultRule.model_validate(rule).model_dump(mode="json") for rule in rules]
        self._admin("PUT", "/_fake/faults", json=validated)

    def set_scenario(self, scenario: Scenario | Mapping[str, Any]) -> None:
        """Replace the scenario, its fault rules and quota included."""
        validated = Scenario.model_validate(scenario)
        self._admin("PUT", "/_fake/scenario", json=validated.model_dump(mode="json", by_alias=True))

    def _admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = httpx.request(method, self.url + path, timeout=ADMIN_TIMEOUT_S, **kwargs)
        return response.raise_for_status()


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free one.

    Its connections have Nagle's algorithm off, as a real API server's do. (asyncio turns it
    off only for sockets made with `IPPROTO_TCP`, which `create_server`'s are not; with it on, a
    reply's body waited for the client's delayed ACK of its headers, 40 ms, on every request
    after the first few of a reused connection.)
    """
    sock = socket.create_server((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
    return sock


def url_of(sock: socket.socket) -> str:
    """The base URL of the server listening on `sock`."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app: ASGIApp) -> uvicorn.Server:
    """A uvicorn server for `app` that leaves logging configuration to the entry point."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    return uvicorn.Server(config)


@contextmanager
def serve_in_thread(
    app: ASGIApp, what: str, *, host: str = "127.0.0.1", timeout_s: float = 10.0
) -> Iterator[str]:
    """Serve `app` from a thread on a free port of `host`; yields its URL once it answers and
    stops it when the block ends. `what` names the server in errors."""
    with listen(host, 0) as sock:
        server = uvicorn_server(app)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=what, daemon=True
        )
        thread.start()
        try:
            deadline = time.monotonic() + timeout_s
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError(f"the {what} server stopped while starting; see its log")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {what} server did not start within {timeout_s} s")
                time.sleep(0.01)
            yield url_of(sock)
        finally:
            server.should_exit = True
            thread.join(timeout_s)

"""Running the fake server (in a thread or as a process) and driving its admin endpoints.

with FakeGemini.start(scenario) as fake:
    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=fake.url))
    ...
    assert [entry["step"] for entry in fake.requests()] == [0, 1]
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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
TICK_S = 0.1
"""How often a server does its housekeeping (uvicorn's `on_tick`: the Date header, limits)."""
DRAIN_POLL_S = 0.001
"""How often a stopping server looks whether its connections and requests are done."""


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
        clock: Callable[[], float] = time.time,
    ) -> Iterator[FakeGemini]:
        """Serve `scenario` on a free port of `host` until the block ends; `clock` is the
        server's (`create_app`)."""
        played = Scenario.model_validate(scenario or {})
        app = create_app(played, record_path=record_path, clock=clock)
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
        response = httpx.request(
            method, self.url + path, timeout=ADMIN_TIMEOUT_S, verify=_tls_context(), **kwargs
        )
        return response.raise_for_status()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every admin request of this process: left alone, httpx makes one per
    request, loading the whole CA bundle (50 ms) for a server that speaks plain HTTP."""
    return ssl.create_default_context()


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


class PromptServer(uvicorn.Server):
    """A uvicorn server that stops as soon as it is asked to (`stop()`), for servers started
    and stopped around every test.

    uvicorn notices `should_exit` at its next tick, up to 0.1 s later, and then gives open
    connections a fixed 0.1 s before it waits for them to close: 0.15 s a server on average,
    more than most tests take. This one wakes when asked to stop, closes idle connections and
    waits, as uvicorn does, for the rest to finish their replies, looking every millisecond.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def stop(self) -> None:
        """Ask the server to stop; safe from any thread, before or after it started."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: it stopped already
                loop.call_soon_threadsafe(wake.set)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        await super().startup(sockets=sockets)

    async def main_loop(self) -> None:
        assert self._wake is not None
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000  # as uvicorn counts its ticks
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # closes an idle connection, ends a busy one after its reply
        while self.server_state.connections or self.server_state.tasks:
            await asyncio.sleep(DRAIN_POLL_S)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


def uvicorn_server(app: ASGIApp) -> PromptServer:
    """A uvicorn server for `app` that leaves logging configuration to the entry point."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    return PromptServer(config)


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
            server.stop()
            thread.join(timeout_s)

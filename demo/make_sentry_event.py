"""Make the demo's Sentry event with the real sentry-sdk.

    python -m demo.make_sentry_event [--out PATH]

Runs the sample repository's checkout on an empty cart under `sentry_sdk`, which raises
ZeroDivisionError, captures it, keeps the event the SDK would have sent (an in-memory transport;
nothing goes over the network) and writes it as JSON. What would tie the file to this machine
is taken out: absolute paths become paths relative to the sample repository (or to Baton's
checkout, for the driver frame), and the host name, installed modules, `sys.argv` and the
Python build string are dropped. The SDK's own event id, timestamp and trace ids are kept.

Needs `sentry-sdk` (a dev dependency).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from demo import SAMPLE_REPO, SENTRY_EVENT

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""Baton's checkout; paths of frames outside the sample repository are made relative to it."""
FAKE_DSN = "https://public@sentry.invalid/1"
"""A DSN the SDK accepts; `.invalid` never resolves, and the transport sends nothing anyway."""


class MemoryTransport(Transport):
    """A transport that keeps the events the SDK hands it, and sends nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.events.append(dict(event))


def capture_sample_event() -> dict[str, Any]:
    """The event sentry-sdk makes of the sample repository's crash, as the SDK built it."""
    transport = MemoryTransport()
    sys.path.insert(0, str(SAMPLE_REPO))
    try:
        cart = importlib.import_module("shopcart.cart")
        checkout = importlib.import_module("shopcart.checkout")
        sentry_sdk.init(
            dsn=FAKE_DSN,
            transport=transport,
            in_app_include=["shopcart"],
            project_root=str(SAMPLE_REPO),  # else every frame under the working directory is in-app
            auto_enabling_integrations=False,  # leave Celery, Redis, httpx … unpatched
            release="shopcart@0.1.0",  # else the SDK reads this checkout's git HEAD
            environment="demo",
        )
        try:
            checkout.summary(cart.Cart())
        except ZeroDivisionError:
            sentry_sdk.capture_exception()
        sentry_sdk.flush()
    finally:
        sentry_sdk.get_client().close()
        sys.path.remove(str(SAMPLE_REPO))
    if len(transport.events) != 1:
        raise RuntimeError(f"expected one event from sentry-sdk, got {len(transport.events)}")
    return transport.events[0]


def neutralize(event: dict[str, Any]) -> dict[str, Any]:
    """A copy of `event` without the details of the machine it was made on."""
    event = copy.deepcopy(event)
    for key in ("server_name", "modules"):
        event.pop(key, None)
    extra = event.get("extra", {})
    extra.pop("sys.argv", None)
    if not extra:
        event.pop("extra", None)
    runtime = event.get("contexts", {}).get("runtime")
    if runtime:
        version = ".".join(str(runtime.get("version", "")).split(".")[:2])
        event["contexts"]["runtime"] = {"name": runtime.get("name"), "version": version}
    for exception in event.get("exception", {}).get("values", []):
        for frame in (exception.get("stacktrace") or {}).get("frames", []):
            _neutralize_frame(frame)
    return event


def _neutralize_frame(frame: dict[str, Any]) -> None:
    path = Path(frame.get("abs_path") or "").resolve()
    if path.is_relative_to(SAMPLE_REPO.resolve()):
        frame["abs_path"] = path.relative_to(SAMPLE_REPO.resolve()).as_posix()
        return
    # Outside the sample repository: the driver (this script). Its locals are reprs with
    # memory addresses, so they go too.
    frame.pop("vars", None)
    if path.is_relative_to(PROJECT_ROOT):
        frame["abs_path"] = path.relative_to(PROJECT_ROOT).as_posix()
    else:
        frame["abs_path"] = path.name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the demo's Sentry event.")
    parser.add_argument("--out", type=Path, default=SENTRY_EVENT, help="where to write the JSON")
    args = parser.parse_args(argv)
    event = neutralize(capture_sample_event())
    args.out.write_text(json.dumps(event, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

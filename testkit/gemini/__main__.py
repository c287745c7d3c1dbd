"""Run the fake Gemini server as a process.

    python -m testkit.gemini --scenario FILE [--host 127.0.0.1] [--port 0] [--record FILE]

Prints `fake-gemini listening on http://HOST:PORT` on stdout once the port is bound (port 0
picks a free one), then serves until SIGTERM or SIGINT and exits 0. Exits 2 when the scenario
cannot be loaded.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from pydantic import ValidationError

from testkit.gemini.harness import listen, url_of, uvicorn_server
from testkit.gemini.scenario import Scenario
from testkit.gemini.server import create_app


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        scenario = Scenario.load(args.scenario)
    except (OSError, ValidationError) as exc:
        print(f"fake-gemini: cannot load the scenario {args.scenario}: {exc}", file=sys.stderr)
        return 2
    app = create_app(scenario, record_path=args.record)
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _exit_quietly)
    with listen(args.host, args.port) as sock:
        print(f"fake-gemini listening on {url_of(sock)}", flush=True)
        uvicorn_server(app).run(sockets=[sock])
    return 0


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    """Stop signals before uvicorn takes over, and the one it re-raises after shutting down."""
    raise SystemExit(0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.gemini",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", required=True, help="scenario JSON file")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--record", default=None, help="append one JSON line per request here")
    return parser


if __name__ == "__main__":
    sys.exit(main())

"""The record of every model request the fake server received.

One entry per model request, faulted ones included (a body that is not a JSON object gets a 400
and no entry)::

    {"ts": 1767000000.1, "replied": 1767000000.2, "agent": "search",
     "model": "gemini-3.8-flash", "stream": false, "step": 0, "status": 200,
     "prompt_tokens": 31, "candidates_tokens": 9, "thoughts_tokens": 5, "cached_tokens": 0,
     "request_chars": 140, "request": {...the parsed request body...}}

`ts` is when the request arrived, `replied` when its answer was ready to send (after any
latency). `status` is 0 for a dropped connection. The token counts are the reply's
`usageMetadata` (see `tokens`); a request that got no reply has only its prompt tokens, the
others 0. `request_chars` is the length of the body's compact JSON (`tokens.compact_json`).
Request headers are never recorded: the API key travels in one.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from testkit.gemini.tokens import compact_json


class Ledger:
    """Entries kept in memory and, when `path` is given, appended to a JSONL file.

    A reset clears the memory only; the file is an append-only log. A lock keeps concurrent
    appends from interleaving lines.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self._path = Path(path) if path is not None else None
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def append(self, entry: dict[str, Any]) -> None:
        """Record one request."""
        line = compact_json(entry) + "\n"
        with self._lock:
            self._entries.append(entry)
            if self._path is not None:
                with self._path.open("a", encoding="utf-8") as file:
                    file.write(line)

    def entries(self) -> list[dict[str, Any]]:
        """A copy of the entries since the last reset, oldest first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        """Forget the in-memory entries."""
        with self._lock:
            self._entries.clear()

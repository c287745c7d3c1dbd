"""Implicit caching: which leading contents of a request an earlier answered request shared.

The real API caches the common beginning of requests on its own and reports the tokens it
served from that cache as `cachedContentTokenCount`. The fake keeps, per model and agent, a
digest of every run of leading contents (with the system instruction and tools) of the requests
it answered with 200; a new request's cached part is its longest run of leading contents found
there. Nothing expires until a reset. `tokens` says how that becomes a count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from testkit.gemini.tokens import compact_json


class PrefixCache:
    """Digests of the leading contents of answered requests.

    Not thread-safe: the server touches it only from its event loop.
    """

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def cached_contents(self, model: str, agent: str, request: Mapping[str, Any]) -> int:
        """How many leading contents of `request` an earlier answered request began with."""
        cached = 0
        for length, digest in enumerate(_prefix_digests(model, agent, request), start=1):
            if digest not in self._seen:
                break
            cached = length
        return cached

    def remember(self, model: str, agent: str, request: Mapping[str, Any]) -> None:
        """Keep the leading contents of a request answered with 200."""
        self._seen.update(_prefix_digests(model, agent, request))

    def reset(self) -> None:
        """Forget every request."""
        self._seen.clear()


def _prefix_digests(model: str, agent: str, request: Mapping[str, Any]) -> Iterator[bytes]:
    """One digest per run of leading contents, shortest first, each chained from the last."""
    context = [model, agent, request.get("systemInstruction"), request.get("tools", [])]
    digest = hashlib.sha256(compact_json(context).encode()).digest()
    for content in request.get("contents") or []:
        digest = hashlib.sha256(digest + compact_json(content).encode()).digest()
        yield digest

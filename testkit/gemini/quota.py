"""The fake server's quota: what each model answered in the last window, and whether one more
request fits.

A request is admitted when, counting what the model answered in its window, one more request
stays within `requests_per_minute` and its prompt tokens stay within `tokens_per_minute`. The
window is the `window_s` before the request arrived (`sliding`), or the fixed window of
`window_s` it arrived in, counted from the epoch, so that minute windows start on the clock's
minutes (`fixed`). An admitted request holds its place from the moment it arrived; it keeps it
(with its prompt and reply tokens) only if it is answered with 200. A request larger than the
whole token quota is admitted when the window is empty.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from testkit.gemini.scenario import Quota


@dataclass(eq=False)
class Answered:
    """One admitted request: when it arrived and the tokens it counts for."""

    ts: float
    tokens: int


class QuotaBook:
    """Per model, the admitted requests of the last window.

    Not thread-safe: the server touches it only from its event loop.
    """

    def __init__(self, quota: Quota | None = None) -> None:
        self._quota = quota
        self._answered: defaultdict[str, list[Answered]] = defaultdict(list)

    def admit(self, model: str, now_s: float, prompt_tokens: int) -> Answered | float:
        """Hold a place for a request; or, when it does not fit, the seconds until it would
        (rounded up to 0.1 s)."""
        entry = Answered(now_s, prompt_tokens)
        if self._quota is None:
            return entry
        window = self._answered[model]
        window[:] = [e for e in window if self._leaves_at(e) > now_s]
        wait_s = max(self._requests_wait(window, now_s), self._tokens_wait(window, now_s, entry))
        if wait_s > 0:
            return math.ceil(wait_s * 10 - 1e-9) / 10
        window.append(entry)
        return entry

    def settle(self, model: str, entry: Answered, status: int, tokens: int) -> None:
        """Keep an admitted request's place with its real tokens if it was answered with 200;
        give the place back otherwise."""
        if self._quota is None:
            return
        if status == 200:
            entry.tokens = tokens
        elif entry in self._answered[model]:
            self._answered[model].remove(entry)

    def replace(self, quota: Quota | None) -> None:
        """A new quota; what was answered still counts."""
        self._quota = quota

    def reset(self) -> None:
        """Forget what was answered."""
        self._answered.clear()

    def _requests_wait(self, window: list[Answered], now_s: float) -> float:
        assert self._quota is not None
        limit = self._quota.requests_per_minute
        if limit is None or len(window) < limit:
            return 0.0
        return self._leaves_at(window[len(window) - limit]) - now_s

    def _tokens_wait(self, window: list[Answered], now_s: float, entry: Answered) -> float:
        assert self._quota is not None
        limit = self._quota.tokens_per_minute
        if limit is None:
            return 0.0
        excess = sum(e.tokens for e in window) + entry.tokens - limit
        leaving = 0
        while excess > 0 and leaving < len(window):
            excess -= window[leaving].tokens
            leaving += 1
        if leaving == 0:
            return 0.0
        return self._leaves_at(window[leaving - 1]) - now_s

    def _leaves_at(self, entry: Answered) -> float:
        """When an answered request stops counting: `window_s` after it arrived (sliding), or
        when the fixed window it arrived in ends."""
        assert self._quota is not None
        window_s = self._quota.window_s
        if self._quota.window == "fixed":
            return (math.floor(entry.ts / window_s) + 1) * window_s
        return entry.ts + window_s

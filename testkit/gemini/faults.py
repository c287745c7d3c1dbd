"""Which fault, if any, a request gets: the rules plus the counters their selectors read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar


class Selecting(Protocol):
    """A fault rule as the book reads it (the fake Gemini's, the fake OpenAI server's)."""

    @property
    def times(self) -> int | None: ...

    def selects(self, agent: str, agent_number: int, overall_number: int) -> bool: ...


FaultRule = TypeVar("FaultRule", bound=Selecting)


class FaultBook(Generic[FaultRule]):
    """Fault rules, the number of requests per agent and in all, and the number of uses per rule.

    Not thread-safe: the server touches it only from its event loop.
    """

    def __init__(self, rules: Iterable[FaultRule] = ()) -> None:
        self._rules = list(rules)
        self._uses = [0] * len(self._rules)
        self._requests: Counter[str] = Counter()
        self._all_requests = 0

    def next_request(self, agent: str) -> tuple[int, FaultRule | None]:
        """Count one more request of `agent`; return its 1-based number among the agent's
        requests and the rule it meets."""
        self._requests[agent] += 1
        self._all_requests += 1
        number = self._requests[agent]
        for index, rule in enumerate(self._rules):
            used_up = rule.times is not None and self._uses[index] >= rule.times
            if not used_up and rule.selects(agent, number, self._all_requests):
                self._uses[index] += 1
                return number, rule
        return number, None

    def replace(self, rules: Iterable[FaultRule]) -> None:
        """Swap in new rules, with fresh use counts; request numbers carry on."""
        self._rules = list(rules)
        self._uses = [0] * len(self._rules)

    def reset(self) -> None:
        """Start counting requests and rule uses from zero again."""
        self._requests.clear()
        self._all_requests = 0
        self._uses = [0] * len(self._rules)

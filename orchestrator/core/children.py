"""The stored sessions of a run's kept children.

A stage's model may ask `delegate` to keep a child (`keep=true` with a name): the child's
session then outlives the call, and a later delegation to the same name, by the same stage or a
later one of the run, continues its conversation (`workers.delegate`). Its id is derived from
the run, its parent and every stage's: `<run>:sub:<branch>` (`subsessions.stable_session_id`).

Between two calls the session is kept here: its events (as ADK serialises them, opaque to the
core), and how many delegations the child itself has made, so that its own children's derived
ids keep counting. One execution at a time talks to a kept child: it claims the child first,
for at most the stage's time limit, so a claim of a lost worker lapses before the stage is
delivered again (the visibility timeout is longer than every stage's time limit).

`ChildStore` keeps them in Redis with the run's other keys (they expire with it); the test
kit's `MemoryChildren` is its in-process double.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.core import keys

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass
class KeptSession:
    """What is kept of one child between calls."""

    events: list[str] = field(default_factory=list)
    """Its session's events, each as the worker serialised it, oldest first."""
    delegations: int = 0
    """How many delegations the child itself has made: its next child is number `+1`."""


class Children(Protocol):
    """Where the sessions of one run's kept children are kept."""

    def claim(self, name: str, holder: str, ttl_s: int) -> bool:
        """Take the child `name` for `holder` for at most `ttl_s`; False: another holds it."""
        ...

    def release(self, name: str, holder: str) -> None:
        """Give the child back, if `holder` still holds it."""
        ...

    def load(self, name: str) -> KeptSession:
        """The child's kept session; an empty one if it was never kept."""
        ...

    def save(self, name: str, session: KeptSession) -> None: ...


class ChildStore:
    """The kept children of run `run_id`, in Redis."""

    def __init__(self, redis: Any, run_id: str) -> None:
        self._redis, self._run_id = redis, run_id
        # EVALSHA (loaded on first use): the worker's Redis user may not EVAL.
        self._release = redis.register_script(_RELEASE)

    def claim(self, name: str, holder: str, ttl_s: int) -> bool:
        key = keys.kept_child_claim(self._run_id, name)
        return bool(self._redis.set(key, holder, nx=True, ex=ttl_s))

    def release(self, name: str, holder: str) -> None:
        self._release(keys=[keys.kept_child_claim(self._run_id, name)], args=[holder])

    def load(self, name: str) -> KeptSession:
        raw = self._redis.get(keys.kept_child(self._run_id, name))
        return KeptSession(**json.loads(raw)) if raw else KeptSession()

    def save(self, name: str, session: KeptSession) -> None:
        document = {"events": session.events, "delegations": session.delegations}
        self._redis.set(keys.kept_child(self._run_id, name), json.dumps(document))

"""A run's spend against its budget, counted in Redis by every execution of the run.

Before each model call an execution reserves the call in one atomic script
(`SpendLedger.reserve`): the script reads what the run has spent, checks the call against every
limit, and either records it (a call, its estimated prompt tokens, its estimated cost) or
refuses it and marks the run's spend `exceeded` with the reason, so that every other execution
of the run (another stage, a branch, a subagent) is refused at its next call too. After the
reply the estimate is replaced by the real count (`reconcile`). Since a call is reserved before
it is sent, concurrent executions cannot pass a limit together: the reserved total never
exceeds a limit, and the real total exceeds it by at most the reply of the calls in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core import keys
from orchestrator.core.errors import RunStateError
from orchestrator.core.runbudget import RunBudget

EXCEEDED = "exceeded"
UNCOSTED = "uncosted:"
HANDOFFS = "handoffs"
"""The spend's count of the run's hand-offs (`orchestrator.core.handoffs`)."""
STOPPED = "run budget exceeded: "
"""How a stage's error and a run's reason begin when a limit of the run's budget stopped it."""

_RESERVE = """
-- KEYS[1]: the spend hash. ARGV: 1 calls limit, 2 tokens limit, 3 cost limit, 4 wall limit (s),
-- 5 iterations limit ('' = none); 6 tokens to reserve, 7 cost to reserve ('' = not costed),
-- 8 the model, 9 seconds since the run began, 10 the iteration.
local stopped = redis.call('HGET', KEYS[1], 'exceeded')
if stopped then return {0, stopped} end
local calls = tonumber(redis.call('HGET', KEYS[1], 'calls') or '0')
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '0')
local cost = tonumber(redis.call('HGET', KEYS[1], 'cost_usd') or '0')
local want_tokens = tonumber(ARGV[6])
local reason = nil
if ARGV[4] ~= '' and tonumber(ARGV[9]) > tonumber(ARGV[4]) then
  reason = string.format('wall time: %.0fs since the run began, limit %ss',
                         tonumber(ARGV[9]), ARGV[4])
elseif ARGV[5] ~= '' and tonumber(ARGV[10]) > tonumber(ARGV[5]) then
  reason = string.format('iterations: iteration %s, limit %s', ARGV[10], ARGV[5])
elseif ARGV[1] ~= '' and calls + 1 > tonumber(ARGV[1]) then
  reason = string.format('model calls: %d made, limit %s', calls, ARGV[1])
elseif ARGV[2] ~= '' and tokens + want_tokens > tonumber(ARGV[2]) then
  reason = string.format('tokens: %d spent + %d for the next call, limit %s',
                         tokens, want_tokens, ARGV[2])
elseif ARGV[3] ~= '' and ARGV[7] ~= '' and cost + tonumber(ARGV[7]) > tonumber(ARGV[3]) then
  reason = string.format('cost: $%.4f spent + $%.4f for the next call, limit $%s',
                         cost, tonumber(ARGV[7]), ARGV[3])
end
if reason then
  redis.call('HSET', KEYS[1], 'exceeded', reason)
  return {0, reason}
end
redis.call('HINCRBY', KEYS[1], 'calls', 1)
redis.call('HINCRBY', KEYS[1], 'tokens', want_tokens)
if ARGV[7] ~= '' then
  redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[7])
else
  redis.call('HINCRBY', KEYS[1], 'uncosted:' .. ARGV[8], 1)
end
return {1, ''}
"""
"""Checks one call against the run's limits and reserves it, or refuses it for good: {1, ''}
reserved, {0, reason} refused."""


@dataclass(frozen=True)
class Reservation:
    """One call reserved: what was counted for it before its reply."""

    tokens: int
    cost_usd: float | None


@dataclass(frozen=True)
class Spend:
    """What a run spent so far, as the ledger holds it."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    handoffs: int = 0
    uncosted: dict[str, int] = field(default_factory=dict)
    """Calls whose model has no price, by model: their cost is not in `cost_usd`."""
    exceeded: str | None = None
    """The limit that stopped the run, with its figures."""

    @classmethod
    def of(cls, fields: dict[str, str]) -> Spend:
        return cls(
            calls=int(fields.get("calls", 0)),
            tokens=int(fields.get("tokens", 0)),
            cost_usd=round(float(fields.get("cost_usd", 0.0)), 6),
            handoffs=int(fields.get(HANDOFFS, 0)),
            uncosted={
                name.removeprefix(UNCOSTED): int(count)
                for name, count in fields.items()
                if name.startswith(UNCOSTED)
            },
            exceeded=fields.get(EXCEEDED) or None,
        )

    def against(self, budget: RunBudget, *, elapsed_s: float | None = None) -> dict[str, Any]:
        """Spend beside each limit, as `status --json` shows it."""
        shown: dict[str, Any] = {
            "calls": {"spent": self.calls, "limit": budget.calls},
            "tokens": {"spent": self.tokens, "limit": budget.tokens},
            "cost_usd": {"spent": self.cost_usd, "limit": budget.cost_usd},
        }
        if elapsed_s is not None:
            shown["wall_s"] = {"spent": round(elapsed_s, 1), "limit": budget.wall_s}
        if self.uncosted:
            shown["cost_usd"]["not_estimated_for"] = dict(self.uncosted)
        shown["iterations"] = {"limit": budget.iterations}
        shown["handoffs"] = {"spent": self.handoffs, "limit": budget.handoffs}
        shown["exceeded"] = self.exceeded
        return shown


class BudgetExceeded(Exception):
    """A call the run's budget refuses; the message names the limit and the figures."""


class SpendLedger:
    """Reserves and reconciles the model calls of runs against their budgets."""

    def __init__(self, client: Any) -> None:
        self.redis = client
        self._reserve = client.register_script(_RESERVE)

    def reserve(
        self,
        run_id: str,
        budget: RunBudget,
        *,
        tokens: int,
        cost_usd: float | None,
        model: str,
        started_at: float,
        iteration: int = 1,
        now: float | None = None,
    ) -> Reservation:
        """Reserve one call of `tokens` (estimated) costing `cost_usd` (None: not costed).

        Raises:
            BudgetExceeded: the call would cross a limit, or another execution of the run was
                already stopped by one; the run's spend stays marked with that reason.
        """
        elapsed_s = (time.time() if now is None else now) - started_at
        ok, reason = self._reserve(
            keys=[keys.spend(run_id)],
            args=[
                _limit(budget.calls), _limit(budget.tokens), _limit(budget.cost_usd),
                _limit(budget.wall_s), _limit(budget.iterations),
                max(0, tokens), "" if cost_usd is None else repr(cost_usd), model,
                repr(max(0.0, elapsed_s)), iteration,
            ],
        )  # fmt: skip
        if not int(ok):
            raise BudgetExceeded(_text(reason))
        return Reservation(tokens=max(0, tokens), cost_usd=cost_usd)

    def reconcile(
        self,
        run_id: str,
        reservation: Reservation,
        *,
        tokens: int,
        cost_usd: float | None,
        sent: bool = True,
    ) -> None:
        """Replace a reservation's estimate by what the call really used; a call never sent
        (its quota wait sent the stage back to its queue) is taken back whole."""
        with self.redis.pipeline(transaction=True) as pipe:
            if not sent:
                pipe.hincrby(keys.spend(run_id), "calls", -1)
            pipe.hincrby(keys.spend(run_id), "tokens", tokens - reservation.tokens)
            if reservation.cost_usd is not None and cost_usd is not None:
                pipe.hincrbyfloat(keys.spend(run_id), "cost_usd", cost_usd - reservation.cost_usd)
            pipe.execute()

    def stop(self, run_id: str, reason: str) -> bool:
        """Mark the run's spend exceeded (the wall time, seen by the reconciler); False if a
        reason was there already."""
        return bool(self.redis.hsetnx(keys.spend(run_id), EXCEEDED, reason))

    def spend(self, run_id: str) -> Spend:
        return Spend.of(self.redis.hgetall(keys.spend(run_id)))


def resume_budget(redis: Any, run: Any, pipe: Any, override: RunBudget | None) -> None:
    """Within `Conductor.resume`'s transaction: the run (a `RunRecord`) goes on with its budget,
    `override`'s limits in place of its own, and its spend's stop mark taken away; what it
    spent stays (it is the run's), so every limit is checked again against it at the next call
    or hand-off.

    Raises:
        RunStateError: a limit of its budget stopped the run and no `override` is given (it
            would be stopped again at once).
    """
    stopped = _text(redis.hget(keys.spend(run.id), EXCEEDED) or "")
    if stopped and override is None:
        raise RunStateError(
            f"run {run.id} was stopped by its budget ({stopped}); resume it with a raised "
            "budget: --budget LIMIT=N (`budget=` from Python)"
        )
    if override is not None:
        run.budget = (run.budget or RunBudget()).over(override)
    if stopped:
        pipe.hdel(keys.spend(run.id), EXCEEDED)


def _limit(value: float | None) -> str:
    return "" if value is None else repr(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

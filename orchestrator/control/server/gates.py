"""`baton serve`'s gate verbs: approve or reject a run's gate (`orchestrator.core.gates`), for
credentials with the control scope; the run's gates themselves are in `GET /runs/{id}`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from orchestrator.control.server.auth import Principal
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import GateStatus, RunStatus

logger = logging.getLogger(__name__)


class ApproveRequest(BaseModel):
    edit: dict[str, Any] | None = None
    """Replaces the gated stage's output (a plan gate's only); it must fit the stage's schema."""


class RejectRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=2000)


class GateReply(BaseModel):
    run_id: str
    gate: str
    gate_status: GateStatus
    applied: bool
    """False: the gate had been decided so before, and nothing changed."""
    queued: str | None = None
    """The stage queued by this approval."""
    status: RunStatus


def gate_routes(conductor: Conductor, api: str, controller: Callable[..., Principal]) -> APIRouter:
    """The routes, under `api`; `controller` is the dependency that admits a request to
    change a run (the control scope)."""
    app = APIRouter()
    Controller = Depends(controller)

    def reply(run_id: str, gate: str, applied: bool, queued: str | None = None) -> GateReply:
        run = conductor.store.get(run_id)
        return GateReply(run_id=run_id, gate=gate, gate_status=run.gates[gate].status,
                         applied=applied, queued=queued, status=run.status)  # fmt: skip

    @app.post(f"{api}/runs/{{run_id}}/gates/{{gate}}/approve", tags=["control"])
    def approve(
        run_id: str, gate: str, body: ApproveRequest | None = None, who: Principal = Controller
    ) -> GateReply:
        """Approve a gate, with an edit of the gated stage's output if given; approving an
        approved gate changes nothing (`applied` false). 409 if it was rejected or expired,
        422 if the edit does not fit the stage's schema."""
        done = conductor.approve(run_id, gate, by=who.name, edit=body.edit if body else None)
        if done.applied:
            logger.info("run %s: gate %s approved by %s", run_id, gate, who.name)
        return reply(run_id, gate, done.applied, done.queued)

    @app.post(f"{api}/runs/{{run_id}}/gates/{{gate}}/reject", tags=["control"])
    def reject(
        run_id: str, gate: str, body: RejectRequest, who: Principal = Controller
    ) -> GateReply:
        """Reject a gate: the run ends `rejected` with the reason. 409 if it was approved."""
        applied = conductor.reject(run_id, gate, by=who.name, reason=body.reason)
        if applied:
            logger.info("run %s: gate %s rejected by %s", run_id, gate, who.name)
        return reply(run_id, gate, applied)

    return app

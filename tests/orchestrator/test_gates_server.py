"""`baton serve`'s gate verbs against a real Redis: the control scope approves (once, with an
edit the stage's schema accepts) or rejects; a read token only sees the gate."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from orchestrator.control.server.app import create_app
from orchestrator.control.server.auth import ServeSettings
from orchestrator.core.conductor import Conductor
from orchestrator.core.models import RunStatus

from .test_gates_conductor import EDITED, PROPOSED, conductor, parked

with warnings.catch_warnings():  # starlette asks for httpx2, which its own client does not need
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

__all__ = ["conductor"]  # the fixture, for the tests here
READ, CONTROL = "read-token-0123456789", "control-token-9876543210"


@pytest.fixture
def client(conductor: Conductor) -> Iterator[TestClient]:
    settings = ServeSettings(
        user="operator", password="correct horse battery staple",
        tokens={"dashboard": f"read:{READ}", "ops": f"control:{CONTROL}"},
    )  # fmt: skip
    with TestClient(create_app(conductor, settings)) as served:
        yield served


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_read_token_sees_the_gate_and_may_not_decide_it(
    conductor: Conductor, client: TestClient
) -> None:
    run_id = parked(conductor)
    url = f"/api/v1/runs/{run_id}"

    run = client.get(url, headers=bearer(READ)).json()
    assert run["summary"]["status"] == "awaiting_approval"
    assert {k: run["gates"]["plan"][k] for k in ("stage", "approve", "status")} == {
        "stage": "plan", "approve": "plan", "status": "pending",
    }  # fmt: skip
    refused = client.post(f"{url}/gates/plan/approve", headers=bearer(READ), json={})
    assert refused.status_code == 403
    assert conductor.store.get(run_id).status == RunStatus.AWAITING_APPROVAL


def test_approving_with_an_edit_is_applied_once(conductor: Conductor, client: TestClient) -> None:
    run_id = parked(conductor)
    url = f"/api/v1/runs/{run_id}/gates/plan"

    bad = client.post(f"{url}/approve", headers=bearer(CONTROL), json={"edit": {"plan": 1}})
    assert bad.status_code == 422
    assert "summary: Field required" in bad.json()["error"]["message"]
    first = client.post(f"{url}/approve", headers=bearer(CONTROL), json={"edit": EDITED})
    again = client.post(f"{url}/approve", headers=bearer(CONTROL), json={"edit": PROPOSED})

    assert first.json() == {"run_id": run_id, "gate": "plan", "gate_status": "approved",
                            "applied": True, "queued": "act", "status": "queued"}  # fmt: skip
    assert (again.status_code, again.json()["applied"]) == (200, False)
    assert conductor.store.output(run_id, "plan") == EDITED
    assert conductor.store.get(run_id).gates["plan"].decided_by == "ops"
    late = client.post(f"{url}/reject", headers=bearer(CONTROL), json={"reason": "late"})
    assert late.status_code == 409


def test_rejecting_needs_a_reason_and_ends_the_run(
    conductor: Conductor, client: TestClient
) -> None:
    run_id = parked(conductor)
    url = f"/api/v1/runs/{run_id}/gates/plan"

    assert client.post(f"{url}/reject", headers=bearer(CONTROL), json={}).status_code == 422
    rejected = client.post(f"{url}/reject", headers=bearer(CONTROL), json={"reason": "no tests"})
    unknown = client.post(f"/api/v1/runs/{run_id}/gates/fix/approve", headers=bearer(CONTROL))

    assert rejected.json()["status"] == "rejected"
    assert conductor.store.get(run_id).reason == "plan: rejected by ops: no tests"
    assert unknown.status_code == 409
    assert "has no gate 'fix' (its gates: plan)" in unknown.json()["error"]["message"]

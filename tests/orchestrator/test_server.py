"""`baton serve`'s REST API against a real redis-server: every endpoint, who may use which,
errors as JSON, paging past the end, and a 12 MB artifact streamed without being read whole.

The run is made the way workers make one — `Conductor.begin`/`complete` with outputs, figures
and artifacts, and audit entries shaped as the agent writes them — not by the code under test.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from openapi_spec_validator import validate

from orchestrator.control.server.app import create_app
from orchestrator.control.server.auth import ServeSettings
from orchestrator.core import keys
from orchestrator.core.conductor import Conductor
from orchestrator.core.execution import StageFigures, StageResult
from orchestrator.core.models import Issue, IssueSource, RunStatus
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

with warnings.catch_warnings():  # starlette asks for httpx2, which its own client does not need
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

READ, CONTROL = "read-token-0123456789", "control-token-9876543210"
PASSWORD = "correct horse battery staple"
BIG = 12 * 1024 * 1024
SEARCH_CALLS = [("search_code", {"pattern": "def total"}), ("read_file", {"path": "cart.py"})]


@dataclass
class Served:
    client: TestClient
    conductor: Conductor
    store: RunStore
    run_id: str

    def get(self, path: str, token: str = READ, **kwargs: object) -> object:
        return self.client.get(path, headers={"Authorization": f"Bearer {token}"}, **kwargs)


def agent_entry(run_id: str, stage: str, kind: str, data: dict[str, object]) -> dict[str, object]:
    """An audit entry as workers/agent.py writes one."""
    return {
        "branch": f"fixer.{stage}", "session": f"{run_id}:{stage}:1", "stage": stage,
        "ts": "1796130587.5", "kind": kind, "author": stage, "data": data,
    }  # fmt: skip


def make_run(conductor: Conductor, store: RunStore) -> str:
    issue = Issue(source=IssueSource.TEXT, title="Checkout crashes on an empty cart")
    run_id, _ = conductor.submit(issue, repo="/srv/git/shop", commit="a" * 40, pipeline="fixer")
    conductor.begin(run_id, "triage", owner="h:1:t", lease_s=30, max_interrupted=3)
    triage = {"actionable": True, "reason": "a bug", "severity": "high", "error_summary": "x"}
    figures = StageFigures(requests=1, prompt_tokens_total=500, prompt_tokens_max=500)
    conductor.complete(run_id, "triage", StageResult(triage, figures), owner="h:1:t")
    conductor.begin(run_id, "search", owner="h:1:u", lease_s=30, max_interrupted=3)
    refs = {
        "workspace.diff": store.put_artifact(
            run_id, "search/workspace.diff", b"--- a/cart.py\n+++ b/cart.py\n+fixed\n",
            "text/x-diff",
        ),
        # Recorded as HTML: served as bytes to download, never as a page a browser would run.
        "big.log": store.put_artifact(
            run_id, "search/big.log", bytes(range(256)) * (BIG // 256), "text/html"
        ),
    }  # fmt: skip
    entries = [agent_entry(run_id, "search", "user_message", {"text": "Do the search stage."})]
    for tool, args in SEARCH_CALLS:
        call = {"function_call": {"name": tool, "args": args}}
        reply = {"function_response": {"name": tool, "response": {"ok": True}}}
        usage = {"prompt_token_count": 1000, "candidates_token_count": 20}
        entries.append(agent_entry(run_id, "search", "tool_call",
                                   {"content": {"parts": [call]}, "usage": usage}))  # fmt: skip
        entries.append(agent_entry(run_id, "search", "tool_result",
                                   {"content": {"parts": [reply]}}))  # fmt: skip
    store.audit(run_id, entries)
    search = {"root_cause": "total divides by zero", "relevant_files": ["cart.py"]}
    figures = StageFigures(requests=2, prompt_tokens_total=2000, prompt_tokens_max=1000,
                           output_tokens=40, artifacts=refs)  # fmt: skip
    conductor.complete(run_id, "search", StageResult(search, figures), owner="h:1:u")
    return run_id


@pytest.fixture
def served(unit_redis_url: str, store: RunStore) -> Iterator[Served]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    conductor = Conductor(store, dispatcher)
    settings = ServeSettings(
        user="operator",
        password=PASSWORD,
        tokens={"dashboard": f"read:{READ}", "ops": f"control:{CONTROL}"},
        max_body_bytes=4096,
    )
    run_id = make_run(conductor, store)
    with TestClient(create_app(conductor, settings)) as client:
        yield Served(client, conductor, store, run_id)
    dispatcher.close()


def test_the_runs_list_pages_filters_and_ends_with_an_empty_page(served: Served) -> None:
    other = Issue(source=IssueSource.TEXT, title="Login times out")
    second, _ = served.conductor.submit(other, repo="/srv/git/auth", commit="b" * 40,
                                        pipeline="fixer")  # fmt: skip
    page = served.get("/api/v1/runs?limit=1").json()
    assert [r["run_id"] for r in page["runs"]] == [second]
    assert (page["total"], page["next_offset"]) == (2, 1)
    page = served.get("/api/v1/runs?limit=1&offset=1").json()
    assert [r["run_id"] for r in page["runs"]] == [served.run_id]
    assert page["runs"][0]["issue"] == "Checkout crashes on an empty cart"
    assert page["runs"][0]["prompt_tokens"] == 2500
    assert page["next_offset"] is None
    past = served.get("/api/v1/runs?offset=50").json()
    assert (past["runs"], past["next_offset"], past["total"]) == ([], None, 2)
    for query, expected in [
        ("q=EMPTY+cart", [served.run_id]),
        ("q=auth", [second]),
        (f"q={served.run_id[-6:]}", [served.run_id]),
        ("repo=/srv/git/shop", [served.run_id]),
        ("pipeline=fixer", [second, served.run_id]),
        ("pipeline=other", []),
        ("status=running", [served.run_id]),
        ("status=queued", [second]),
        ("status=done", []),
    ]:
        found = [r["run_id"] for r in served.get(f"/api/v1/runs?{query}").json()["runs"]]
        assert found == expected, query


def test_a_run_reads_back_with_its_stages_outputs_time_line_and_tokens(served: Served) -> None:
    run = served.get(f"/api/v1/runs/{served.run_id}").json()
    assert run["summary"]["status"] == "running"
    assert run["issue"]["title"] == "Checkout crashes on an empty cart"
    assert list(run["stages"])[:3] == ["triage", "search", "plan"]
    assert run["stages"]["search"]["status"] == "done"
    assert run["stages"]["plan"]["status"] == "queued"
    assert run["outputs"] == ["triage", "search"]
    assert run["change"] == "search/workspace.diff"
    output = served.get(f"/api/v1/runs/{served.run_id}/outputs/search").json()
    assert output == {"root_cause": "total divides by zero", "relevant_files": ["cart.py"]}

    spans = served.get(f"/api/v1/runs/{served.run_id}/timeline").json()
    done = [(s["label"], s["state"]) for s in spans if s["state"] != "queued"]
    assert done == [("triage", "done"), ("search", "done")]
    assert all(s["end"] >= s["start"] for s in spans if s["end"] is not None)

    tokens = served.get(f"/api/v1/runs/{served.run_id}/tokens").json()
    by_stage = {s["stage"]: s["prompt_tokens"] for s in tokens["stages"]}
    assert (by_stage["triage"], by_stage["search"], tokens["prompt_tokens"]) == (500, 2000, 2500)
    assert [c["made"] for c in tokens["calls"]] == [tool for tool, _ in SEARCH_CALLS]
    assert [c["prompt_tokens"] for c in tokens["calls"]] == [1000, 1000]


def test_the_audit_reads_as_a_transcript_page_by_page(served: Served) -> None:
    url = f"/api/v1/runs/{served.run_id}/audit"
    everything = served.store.redis.xrange(keys.audit(served.run_id))
    seen, after = [], None
    while True:
        page = served.get(url, params={"limit": 3, **({"after": after} if after else {})}).json()
        seen += page["entries"]
        after = page["next_after"]
        if after is None:
            break
    assert [e["id"] for e in seen] == [entry_id for entry_id, _ in everything]
    search = served.get(url, params={"stage": "search"}).json()["entries"]
    calls = [(p["tool"], p["args"]) for e in search for p in e["parts"] if p["kind"] == "call"]
    assert calls == [(tool, args) for tool, args in SEARCH_CALLS]
    assert [e["kind"] for e in search][:3] == ["stage_begin", "user_message", "tool_call"]
    assert search[1]["parts"] == [
        {"kind": "text", "text": "Do the search stage.", "tool": None, "args": None,
         "result": None},
    ]  # fmt: skip
    last = everything[-1][0]
    past = served.get(url, params={"after": last}).json()
    assert past == {"entries": [], "next_after": None}


def test_artifacts_are_listed_and_a_12_mb_one_is_streamed_in_chunks(served: Served) -> None:
    listed = served.get(f"/api/v1/runs/{served.run_id}/artifacts").json()
    assert [(a["name"], a["size_bytes"]) for a in listed] == [
        ("search/workspace.diff", 35),
        ("search/big.log", BIG),
    ]
    diff = served.get(f"/api/v1/runs/{served.run_id}/diff")
    assert diff.headers["content-type"] == "text/x-diff; charset=utf-8"
    assert diff.text.endswith("+fixed\n")

    redis = served.store.redis
    redis.config_resetstat()
    digest, chunks, size = hashlib.sha256(), 0, 0
    url = f"/api/v1/runs/{served.run_id}/artifacts/search/big.log"
    with served.client.stream("GET", url, headers={"Authorization": f"Bearer {READ}"}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-length"] == str(BIG)
        assert reply.headers["content-type"] == "application/octet-stream"
        assert reply.headers["content-disposition"].startswith("attachment")
        for chunk in reply.iter_raw():
            digest.update(chunk)
            chunks += 1
            size += len(chunk)
    assert size == BIG
    assert digest.hexdigest() == hashlib.sha256(bytes(range(256)) * (BIG // 256)).hexdigest()
    stats = redis.info("commandstats")
    # Read as 48 ranges of 256 KiB, never by one GET of the whole value.
    assert stats["cmdstat_getrange"]["calls"] == BIG // (256 * 1024)
    assert "cmdstat_get" not in stats
    assert chunks > 1


def test_cancel_and_resume_need_the_control_scope(served: Served) -> None:
    url = f"/api/v1/runs/{served.run_id}"
    refused = served.client.post(f"{url}/cancel", headers={"Authorization": f"Bearer {READ}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == "dashboard may look but not control runs"
    assert served.store.get(served.run_id).status == RunStatus.RUNNING

    control = {"Authorization": f"Bearer {CONTROL}"}
    cancelled = served.client.post(f"{url}/cancel", headers=control)
    assert cancelled.json() == {"run_id": served.run_id, "status": "cancelled"}
    assert served.store.get(served.run_id).status == RunStatus.CANCELLED
    again = served.client.post(f"{url}/cancel", headers=control)
    assert again.status_code == 409
    assert "had already ended (cancelled)" in again.json()["error"]["message"]

    resumed = served.client.post(f"{url}/resume", headers=control, json={})
    assert resumed.json() == {"run_id": served.run_id, "resumed_from": "plan"}
    assert served.store.get(served.run_id).status == RunStatus.QUEUED
    queued = [
        json.loads(m)["headers"]["id"] for m in served.store.redis.lrange("baton.fixer.plan", 0, -1)
    ]
    assert f"{served.run_id}.plan" in queued
    unknown = served.client.post(f"{url}/resume", headers=control, json={"from_stage": "nope"})
    assert unknown.status_code in (409, 422)
    assert "nope" in unknown.json()["error"]["message"]


def test_who_may_do_what(served: Served) -> None:
    client = served.client
    anonymous = client.get("/api/v1/runs")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.json() == {
        "error": {"status": 401, "message": "log in, or send a bearer token"}
    }
    assert served.get("/api/v1/runs", token="not-a-token").status_code == 401
    assert client.get("/api/v1/health").json() == {"status": "ok"}  # probes need no login
    page = client.get(f"/runs/{served.run_id}", follow_redirects=False)
    assert (page.status_code, page.headers["location"]) == (
        303,
        f"/login?next=/runs/{served.run_id}",
    )

    wrong = client.post("/login", data={"user": "operator", "password": "guess", "next": "/"},
                        follow_redirects=False)  # fmt: skip
    assert wrong.headers["location"].startswith("/login?failed=1")
    assert "baton_session" not in wrong.cookies
    login = {"user": "operator", "password": PASSWORD, "next": "//evil.example/"}
    offsite = client.post("/login", data=login, follow_redirects=False)
    assert offsite.headers["location"] == "/"
    assert client.get("/api/v1/me").json() == {
        "name": "operator", "scope": "control", "flower_url": None,
    }  # fmt: skip
    cancel = f"/api/v1/runs/{served.run_id}/cancel"
    forged = client.post(cancel)  # a form on another site cannot add the header
    assert forged.status_code == 403
    assert "X-Baton-Request" in forged.json()["error"]["message"]
    assert client.post(cancel, headers={"X-Baton-Request": "1"}).status_code == 200
    client.post("/logout")
    assert client.get("/api/v1/me").status_code == 401


def test_errors_are_json_naming_what_was_wrong(served: Served) -> None:
    missing = served.get("/api/v1/runs/20990101-000000-000000")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no run with id '20990101-000000-000000'"
    for path, message in [
        (
            f"/api/v1/runs/{served.run_id}/outputs/fix",
            "has no output 'fix' (it has: triage, search)",
        ),
        (f"/api/v1/runs/{served.run_id}/artifacts/nope.log", "has no artifact 'nope.log'"),
        ("/api/v1/runs/20990101-000000-000000/audit", "no run with id"),
    ]:
        reply = served.get(path)
        assert reply.status_code == 404, path
        assert message in reply.json()["error"]["message"]
    bad = served.get("/api/v1/runs?limit=100000&status=lost")
    assert bad.status_code == 422
    assert "query.limit" in bad.json()["error"]["message"]
    assert "query.status" in bad.json()["error"]["message"]
    assert served.get(f"/api/v1/runs/{served.run_id}/audit?after=';DROP").status_code == 422
    control = {"Authorization": f"Bearer {CONTROL}", "Content-Type": "application/json"}
    resume = f"/api/v1/runs/{served.run_id}/resume"
    malformed = served.client.post(resume, headers=control, content=b'{"from_stage": ')
    assert malformed.status_code == 422
    assert "JSON" in malformed.json()["error"]["message"]
    huge = served.client.post(resume, headers=control, content=b"{" + b" " * 10_000 + b"}")
    assert huge.status_code == 413
    assert huge.json()["error"]["message"] == "the request body is over 4,096 bytes"
    assert served.store.get(served.run_id).status == RunStatus.RUNNING  # nothing was done
    assert served.client.get("/api/v1/nowhere").json()["error"]["status"] == 404


def test_the_openapi_document_is_valid_and_describes_every_endpoint(served: Served) -> None:
    document = served.client.get("/api/openapi.json").json()
    validate(document)
    operations = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert operations == {
        ("GET", "/api/v1/health"), ("GET", "/api/v1/me"), ("GET", "/api/v1/runs"),
        ("GET", "/api/v1/runs/{run_id}"), ("GET", "/api/v1/runs/{run_id}/outputs/{key}"),
        ("GET", "/api/v1/runs/{run_id}/timeline"), ("GET", "/api/v1/runs/{run_id}/tokens"),
        ("GET", "/api/v1/runs/{run_id}/audit"), ("GET", "/api/v1/runs/{run_id}/artifacts"),
        ("GET", "/api/v1/runs/{run_id}/artifacts/{name}"), ("GET", "/api/v1/runs/{run_id}/diff"),
        ("POST", "/api/v1/runs/{run_id}/cancel"), ("POST", "/api/v1/runs/{run_id}/resume"),
        ("POST", "/api/v1/runs/{run_id}/gates/{gate}/approve"),
        ("POST", "/api/v1/runs/{run_id}/gates/{gate}/reject"),
    }  # fmt: skip
    runs = document["paths"]["/api/v1/runs"]["get"]
    assert {p["name"] for p in runs["parameters"]} == {
        "status", "pipeline", "repo", "q", "offset", "limit",
    }  # fmt: skip
    assert "ErrorReply" in json.dumps(runs["responses"]["404"])

"""Run inspection at size: `baton serve` answering for a store of 10,000 runs, one of which
has 2,000 audit entries.

A private redis-server is filled the way workers fill one — run records of six finished stages
with their figures and artifacts, audit entries shaped as the agent writes them (tool calls with
usage, tool results of about a kilobyte and a half, transitions) — and a real `baton serve`
subprocess answers over HTTP on 127.0.0.1. Server time is what the server says it took
(`Server-Timing`, from the request's arrival to the start of its response); the client's wall
time, loopback and httpx included, is shown beside it.

* **run page**: the requests the web UI's run page makes when it opens (`page_requests`,
  `audit_pages`), in sequence, for the run with 2,000 audit entries, opened on its fix stage
  (1,500 of them); the page's server time is their sum. Target: under 300 ms.
* **runs list**: `GET /api/v1/runs` (the UI's first page, 50 runs) with 10,000 runs stored.
  Target: p95 under 100 ms (200 requests). Beside it, two lists that must look further
  (50 requests each): `status=failed` (every fifth run) and a text search that matches a
  single run, which reads the filters' fields of all 10,000.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench import record
from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED
from orchestrator.core import keys
from orchestrator.core.models import (
    ArtifactRef,
    Issue,
    IssueSource,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.store import RunStore, run_fields
from testkit import services

CODE: tuple[str, ...] = ("bench/inspection.py", "orchestrator/", "testkit/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

RUNS = 10_000
AUDIT_ENTRIES = 2_000
STAGES = ("triage", "search", "plan", "reproduce", "fix", "pr")
LIST_SAMPLES = 200
PAGE_SAMPLES = 30
AUDIT_PAGE = 500
"""The transcript's page size (transcript.js)."""
TOKEN = "bench-inspection-token"
TARGET_PAGE_MS = 300.0
TARGET_LIST_P95_MS = 100.0


OPENED_ON = "fix"
"""The stage the run page is opened on (`/runs/RUN#fix`): the one whose session holds most of
the audit (`FIX_ENTRIES`), as a long fix loop's would."""
FIX_ENTRIES = 1_500


def page_requests(run_id: str) -> list[str]:
    """What the run page fetches when it opens on a stage (orchestrator/control/server/static/run.js
    and stage.js): the page, who is asking, the run, its time line and tokens, the stage's output;
    then the stage's transcript, `AUDIT_PAGE` entries a request (`audit_pages`)."""
    api = f"/api/v1/runs/{run_id}"
    return [
        f"/runs/{run_id}",
        "/api/v1/me",
        api,
        f"{api}/timeline",
        f"{api}/tokens",
        f"{api}/outputs/{OPENED_ON}",
    ]


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("inspection: fill 10,000 runs, then measure", total=3)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        url = stack.enter_context(services.redis_server(work / "redis"))
        store = RunStore.from_url(url)
        started = time.monotonic()
        page_run = fill(store)
        filled_s = time.monotonic() - started
        progress.advance(task)
        env = {"BATON_SERVE_TOKENS": json.dumps({"bench": f"read:{TOKEN}"})}
        base = stack.enter_context(services.serve(url, env, logfile=work / "serve.log"))
        client = stack.enter_context(
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"})
        )
        page = measure_page(client, page_run)
        progress.advance(task)
        needle = store.get(store.recent(RUNS)[RUNS // 2]).issue.title
        lists = {
            "first page": measure_list(client, "/api/v1/runs"),
            "status=failed": measure_list(client, "/api/v1/runs?status=failed", samples=50),
            "text matching one run": measure_list(
                client, "/api/v1/runs", {"q": needle}, samples=50
            ),
        }
        progress.advance(task)
        store.redis.close()
    figures: dict[str, Any] = {
        "runs": RUNS, "audit_entries": AUDIT_ENTRIES, "fill_s": round(filled_s, 1),
        "run_page": page, "runs_list": lists,
    }  # fmt: skip
    figures["targets"] = {
        "run_page_server_ms": {
            "value": page["server_ms_p50"], "target": f"< {TARGET_PAGE_MS:.0f}",
            "met": page["server_ms_p50"] < TARGET_PAGE_MS,
        },
        "runs_list_p95_ms": {
            "value": lists["first page"]["server_ms_p95"],
            "target": f"< {TARGET_LIST_P95_MS:.0f}",
            "met": lists["first page"]["server_ms_p95"] < TARGET_LIST_P95_MS,
        },
    }  # fmt: skip
    return figures


def fill(store: RunStore) -> str:
    """10,000 finished runs, the newest with 2,000 audit entries; returns that one's id."""
    rng = random.Random(7)
    now = time.time()
    newest = ""
    with store.redis.pipeline(transaction=False) as pipe:
        for n in range(RUNS):
            status = RunStatus.FAILED if n % 5 == 0 else RunStatus.DONE
            run = finished_run(n, now - (RUNS - n) * 30.0, status, rng)
            for key, value in run_fields(run).items():
                pipe.hset(keys.run(run.id), key, value)
            pipe.zadd(keys.RUNS, {run.id: run.created_at})
            newest = run.id
            if n % 500 == 499:
                pipe.execute()
        pipe.execute()
    store.audit(newest, audit_entries(newest, rng))
    for stage in STAGES:
        files = [f"src/m{i}.py" for i in range(5)]
        output = {"summary": f"what {stage} found " * 20, "files": files}
        store.redis.hset(keys.outputs(newest), stage, json.dumps(output))
    diff = "".join(f"+line {i} of the change\n" for i in range(400)).encode()
    log = "".join(f"tests/test_m.py::test_{i} PASSED\n" for i in range(400)).encode()
    for stage in STAGES:
        store.put_artifact(newest, f"{stage}/workspace.diff", diff, "text/x-diff")
        store.put_artifact(newest, f"{stage}/tests-after.log", log)
    return newest


def finished_run(n: int, created: float, status: RunStatus, rng: random.Random) -> RunRecord:
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(created)) + f"-{n:06x}"
    stages = {}
    clock = created
    for stage in STAGES:
        took = rng.uniform(0.5, 20.0)
        refs = {
            name: ArtifactRef(
                run_id=run_id, name=f"{stage}/{name}", size_bytes=2048, sha256="0" * 64
            )
            for name in ("workspace.diff", "tests-after.log")
        }
        stages[stage] = StageRecord(
            status=StageStatus.DONE, attempts=1, queued_at=clock, started_at=clock + 0.01,
            finished_at=clock + took, requests=rng.randint(1, 8),
            prompt_tokens_total=rng.randint(500, 20_000), prompt_tokens_max=4_000,
            output_tokens=300, output_chars=900, session_id=f"{run_id}:{stage}:1", artifacts=refs,
        )  # fmt: skip
        clock += took
    issue = Issue(
        source=IssueSource.SENTRY_EVENT, source_id=f"{n:032x}",
        title=f"ZeroDivisionError in checkout {n}: integer division or modulo by zero",
        error_type="ZeroDivisionError", error_message="integer division or modulo by zero",
    )  # fmt: skip
    return RunRecord(
        id=run_id, pipeline="fixer", repo=f"https://github.com/acme/shop{n % 20}",
        commit="c" * 40, issue=issue, idempotency_key=issue.idempotency_key(), status=status,
        reason="fix: tests still fail (after 3 iterations)" if status == RunStatus.FAILED else None,
        created_at=created, updated_at=clock, stages=stages,
    )  # fmt: skip


def audit_entries(run_id: str, rng: random.Random) -> list[dict[str, Any]]:
    """2,000 entries: `FIX_ENTRIES` in the fix stage's session, the rest shared by the others."""
    others = [stage for stage in STAGES if stage != OPENED_ON]
    share = (AUDIT_ENTRIES - FIX_ENTRIES) // len(others)
    counts = {stage: share for stage in others}
    counts[OPENED_ON] = AUDIT_ENTRIES - share * len(others)
    entries: list[dict[str, Any]] = []
    for stage in STAGES:
        labels = {"branch": f"fixer.{stage}", "session": f"{run_id}:{stage}:1", "stage": stage}
        entries.append({**labels, "ts": repr(time.time()), "kind": "stage_begin",
                        "data": {"action": "run"}})  # fmt: skip
        for i in range(counts[stage] - 1):
            if i % 2 == 0:
                call = {"function_call": {"name": "read_file", "args": {"path": f"src/m{i}.py"}}}
                usage = {"prompt_token_count": rng.randint(1000, 9000),
                         "candidates_token_count": 40}  # fmt: skip
                data: dict[str, Any] = {"content": {"parts": [call]}, "usage": usage}
                kind = "tool_call"
            else:
                text = "".join(f"{n:4}| some source line of the module\n" for n in range(40))
                reply = {"function_response": {"name": "read_file", "response": {"content": text}}}
                data, kind = {"content": {"parts": [reply]}}, "tool_result"
            entries.append({**labels, "ts": repr(time.time()), "kind": kind, "author": stage,
                            "data": data})  # fmt: skip
    return entries


def audit_pages(client: httpx.Client, run_id: str) -> list[httpx.Response]:
    """The transcript of the stage the page is opened on, page after page, as it is read."""
    replies, after = [], None
    while True:
        params: dict[str, Any] = {"stage": OPENED_ON, "limit": AUDIT_PAGE}
        if after:
            params["after"] = after
        reply = client.get(f"/api/v1/runs/{run_id}/audit", params=params)
        replies.append(reply)
        after = reply.json()["next_after"]
        if after is None:
            return replies


def _server_ms(reply: httpx.Response) -> float:
    timing = reply.headers["server-timing"]  # app;dur=12.3
    return float(timing.partition("dur=")[2])


def measure_page(client: httpx.Client, run_id: str) -> dict[str, Any]:
    requests = page_requests(run_id)
    for path in requests:  # warm up, and check every request is answered
        reply = client.get(path)
        if reply.status_code != 200:
            raise AssertionError(f"{path}: {reply.status_code} {reply.text[:200]}")
    per_request: dict[str, list[float]] = {path: [] for path in [*requests, "audit"]}
    server, wall, audit_requests = [], [], 0
    for _ in range(PAGE_SAMPLES):
        total_server = 0.0
        started = time.perf_counter()
        for path in requests:
            reply = client.get(path)
            took = _server_ms(reply)
            per_request[path].append(took)
            total_server += took
        pages = audit_pages(client, run_id)
        audit_requests = len(pages)
        per_request["audit"].append(sum(_server_ms(p) for p in pages))
        total_server += per_request["audit"][-1]
        wall.append((time.perf_counter() - started) * 1000)
        server.append(total_server)
    slowest = sorted(per_request.items(), key=lambda kv: -statistics.median(kv[1]))[:4]
    return {
        "requests": len(requests) + audit_requests,
        "server_ms_p50": round(statistics.median(server), 1),
        "server_ms_p95": round(record.percentile(server, 0.95), 1),
        "wall_ms_p50": round(statistics.median(wall), 1),
        "slowest": {
            path.replace(run_id, "RUN"): round(statistics.median(ms), 1) for path, ms in slowest
        },
    }


def measure_list(
    client: httpx.Client,
    path: str,
    params: dict[str, str] | None = None,
    *,
    samples: int = LIST_SAMPLES,
) -> dict[str, Any]:
    client.get(path, params=params)
    server, wall, found = [], [], 0
    for _ in range(samples):
        started = time.perf_counter()
        reply = client.get(path, params=params)
        wall.append((time.perf_counter() - started) * 1000)
        server.append(_server_ms(reply))
        found = len(reply.json()["runs"])
    return {
        "runs_returned": found,
        "server_ms_p50": round(statistics.median(server), 1),
        "server_ms_p95": round(record.percentile(server, 0.95), 1),
        "wall_ms_p95": round(record.percentile(wall, 0.95), 1),
    }


HISTORY = ["run page: server ms (p50)", "runs list: server ms p95", "status=failed: p95",
           "text search over 10,000: p95", "targets met"]  # fmt: skip
"""The history table's columns after the date and commit (`row`)."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    page, lists = source["run_page"], source["runs_list"]
    return [
        f"{page['server_ms_p50']} ms",
        f"{lists['first page']['server_ms_p95']} ms",
        f"{lists['status=failed']['server_ms_p95']} ms",
        f"{lists['text matching one run']['server_ms_p95']} ms",
        "yes" if all(t["met"] for t in source["targets"].values()) else "**no**",
    ]


def latest(source: Source) -> str:
    """The latest run: the run page, the lists, the slowest requests, the targets."""
    page, lists = source["run_page"], source["runs_list"]
    rows = [
        [f"run page ({page['requests']} requests, {source['audit_entries']:,} audit entries)",
         "—", f"{page['server_ms_p50']}", f"{page['server_ms_p95']}",
         f"{page['wall_ms_p50']} (p50)"],
    ] + [
        [f"runs list: {name}", str(f["runs_returned"]), f"{f['server_ms_p50']}",
         f"{f['server_ms_p95']}", f"{f['wall_ms_p95']} (p95)"]
        for name, f in lists.items()
    ]  # fmt: skip
    header = ["what", "runs returned", "server ms p50", "server ms p95", "client wall ms"]
    slowest = ", ".join(f"`{path}` {ms} ms" for path, ms in page["slowest"].items())
    stored = f"{source['runs']:,} runs stored"
    return (
        f"{latest_run(source, stored)}:\n\n"
        f"{table(header, rows)}\n\nThe run page's slowest requests (p50): {slowest}.\n\n"
        + targets_table(source["targets"])
    )


def summary(source: Source) -> str:
    """What the docs of `baton serve` say of the latest run."""
    page, first = source["run_page"], source["runs_list"]["first page"]
    return (
        f"Measured ({source.stamp}; `python -m bench inspection`): with {source['runs']:,} runs "
        f"stored, the runs list answered in {first['server_ms_p50']:.0f} ms of server time at "
        f"p50 ({first['server_ms_p95']:.0f} ms at p95), and a run page with "
        f"{source['audit_entries']:,} audit entries, opened on the stage holding most of them, "
        f"took {page['server_ms_p50']:.0f} ms of server time in all at p50 "
        f"({page['server_ms_p95']:.0f} ms at p95)."
    )


SECTIONS = {"latest": latest, "summary": summary}

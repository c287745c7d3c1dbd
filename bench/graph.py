"""Isolation in a graph: `fixer-plus` on the demo's repository, every session's requests read
from the fake server's log (`python -m bench graph`).

One run of `fixer-plus` (`demo.plus`: the plan gated and approved, two search children, three
fix branches at once on three worker processes, real sandboxes) on the fake Gemini through the
real google-genai client. Each session is found in the log by its agent's name (a child's is
`sub_<name>`) and, for a fix branch, by the branch id its instruction holds. Per session: its
model requests, the largest request's and all its requests' prompt tokens (the server's own
counts), and the function-call and function-response parts that are not its own
(`testkit.leaks.foreign_parts`: a call its script never made, a response to no call of the turn
before). Isolation holds when that count is 0 for every session while each branch's calls differ
(every fix branch makes its own edit); a control plants one branch's edit in another's requests
and must find it.
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.docs import Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import bench_settings, together
from demo import SENTRY_EVENT
from demo.plus import FIXES, SELECTED, branch_marker, scenario
from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core.models import RunStatus
from orchestrator.core.pipeline import load_pipeline
from testkit import services
from testkit.gemini import FakeGemini
from testkit.leaks import call_key, foreign_parts, scripted_calls
from testkit.services import worker_env

CODE: tuple[str, ...] = ("bench/graph.py", *STACK, "demo/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PIPELINE = "fixer-plus"
WORKERS = 3
RUN_TIMEOUT_S = 300.0

Requests = list[dict[str, Any]]


def sessions(entries: list[dict[str, Any]]) -> dict[str, Requests]:
    """The requests of each session of the run, by session name (`fix.b2`, `sub_cart`, ...),
    in the order the server received them."""
    found: dict[str, Requests] = {}
    for entry in sorted(entries, key=lambda e: e["ts"]):
        agent = entry["agent"]
        if agent == "fix":
            system = json.dumps(entry["request"].get("systemInstruction", {}))
            agent = next((f"fix.{b}" for b in FIXES if branch_marker(b) in system), "fix.?")
        found.setdefault(agent, []).append(entry)
    return found


def own_calls(played: dict[str, Any], session: str) -> set[str]:
    """The calls the scenario has a session make (a fix branch: its variant's)."""
    if not session.startswith("fix."):
        return scripted_calls(played, session)
    branch = session.removeprefix("fix.")
    variant = next(
        v for v in played["agents"]["fix"]["variants"] if v["when"] == branch_marker(branch)
    )
    return scripted_calls({"agents": {"fix": variant["steps"]}}, "fix")


def figures(found: dict[str, Requests], played: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per session: requests, prompt tokens (largest, total), foreign parts."""
    return {
        name: {
            "requests": len(entries),
            "max_prompt_tokens": max(e["prompt_tokens"] for e in entries),
            "prompt_tokens_total": sum(e["prompt_tokens"] for e in entries),
            "foreign_parts": len(
                foreign_parts([e["request"] for e in entries], own_calls(played, name))
            ),
        }
        for name, entries in found.items()
    }


def control(found: dict[str, Requests], played: dict[str, Any]) -> int:
    """The foreign parts found in b2's requests with b1's edit planted in its last one (as a
    model turn and its answer): the check must see it."""
    b1_edit = next(
        step["call"]
        for v in played["agents"]["fix"]["variants"]
        if v["when"] == branch_marker("b1")
        for step in v["steps"]
        if "call" in step and step["call"]["name"] == "edit_file"
    )
    requests = [copy.deepcopy(e["request"]) for e in found["fix.b2"]]
    requests[-1]["contents"] += [
        {"role": "model", "parts": [{"functionCall": b1_edit}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "edit_file", "response": {}}}]},
    ]
    planted = foreign_parts(requests, own_calls(played, "fix.b2"))
    return sum(1 for _kind, sample in planted if sample == call_key(b1_edit))


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("graph: one fixer-plus run, three fix branches", total=1)
    played = scenario()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        (work / "scenario.json").write_text(json.dumps(played))
        fake = FakeGemini(stack.enter_context(services.fake_gemini(work / "scenario.json")))
        redis_url = stack.enter_context(services.redis_server(work / "redis"))
        settings = bench_settings(redis_url, fake.url, work)
        queues = [stage.queue for stage in load_pipeline(PIPELINE).stages]
        env = worker_env(settings)
        stack.enter_context(together([
            services.worker(env, queues, logfile=work / f"w{n}.log", name=f"bench-graph-{n}")
            for n in range(1, WORKERS + 1)
        ]))  # fmt: skip
        repo = make_sample_repo(work / "shopcart")
        started = time.monotonic()
        run_id = api.enqueue(SENTRY_EVENT.read_bytes(), repo=str(repo), pipeline=PIPELINE,
                             settings=settings, force=True)  # fmt: skip
        _until(settings, run_id, lambda s: s == RunStatus.AWAITING_APPROVAL)
        api.approve(run_id, by="bench", settings=settings)
        _until(settings, run_id, lambda s: s.is_terminal)
        took_s = time.monotonic() - started
        record = api.get_run(run_id, settings=settings)
        if record.status != RunStatus.DONE:
            raise RuntimeError(f"the fixer-plus run ended {record.status.value}: {record.reason}")
        fan = record.stages["fix"].fan_in
        selected = fan.selected if fan is not None else None
        if selected != SELECTED:
            raise RuntimeError(f"the proof selected {selected}, not {SELECTED}")
        found = sessions(fake.requests())
        progress.advance(task)
    spans = {name: (min(e["ts"] for e in es), max(e["replied"] for e in es))
             for name, es in found.items() if name.startswith("fix.")}  # fmt: skip
    overlap_s = min(end for _s, end in spans.values()) - max(start for start, _e in spans.values())
    return {
        "pipeline": PIPELINE,
        "workers": WORKERS,
        "run_s": round(took_s, 1),
        "selected": selected,
        "fix_branches_overlap_s": round(overlap_s, 2),
        "sessions": figures(found, played),
        "control_found": control(found, played),
    }


def _until(settings: Any, run_id: str, done: Any) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not done((run := api.get_run(run_id, settings=settings)).status):
        if run.status.is_terminal or time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} is {run.status.value}: {run.reason}")
        time.sleep(0.2)


def latest(source: Source) -> str:
    """The latest run: one row per session."""
    rows = [
        [f"`{name}`", str(s["requests"]), str(s["max_prompt_tokens"]),
         str(s["prompt_tokens_total"]), str(s["foreign_parts"])]
        for name, s in source["sessions"].items()
    ]  # fmt: skip
    header = ["session", "requests", "largest request (tokens)", "all requests (tokens)",
              "parts not its own"]  # fmt: skip
    run = f"one `{source['pipeline']}` run on {source['workers']} workers"
    return (
        f"{latest_run(source, run)}:\n\n{table(header, rows)}\n\n"
        f"The fix branches ran at once for {source['fix_branches_overlap_s']:.2f} s; the proof "
        f"selected `{source['selected']}`. The control (one branch's edit planted in another's "
        f"requests) was found {source['control_found']} time(s)."
    )


SECTIONS = {"latest": latest}

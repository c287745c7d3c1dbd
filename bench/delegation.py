"""What a subagent costs in-process (`python -m bench delegation`).

One `search` stage, run by `execute_stage` on the in-process fake Gemini (the real google-genai
client over httpx's ASGI transport: no socket, so what is measured is Baton's and ADK's own
time), two ways with the same four model calls:

- `flat`: the stage reads three notes itself, then answers;
- `delegated`: the stage delegates; its child reads one note and answers with a summary; the
  stage answers;
- `kept`: as `delegated`, but the child is kept (`keep=true`) and is asked for the second time:
  its session (one earlier turn) is claimed, read from a real redis-server, restored, and stored
  again after its turn.

Per variant: the median and p95 wall time of one stage execution over `REPEATS` runs, and the
size of the stage's last request (the child's notes never reach it, only its summary). The
difference of the medians is what starting a child in-process (an agent, a runner, a session, a
toolbox) costs over making the same model calls in the stage itself; `kept` against `delegated`,
what keeping a child costs on top (Redis round trips on this machine, the restored history, and
the longer requests the child then sends).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.docs import Source, latest_run, table
from bench.record import SHARED, percentile
from orchestrator.core.children import Children, ChildStore
from orchestrator.core.pipeline import ISSUE_KEY, load_pipeline
from testkit import services
from testkit.inprocess import InProcessGemini
from testkit.sinks import MemoryArtifacts
from workers.inputs import StageInputs
from workers.stage import StageSinks, execute_stage

CODE: tuple[str, ...] = ("bench/delegation.py", "orchestrator/", "workers/", "testkit/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

REPEATS = 100
NOTE_CHARS = 200
"""Small, so that the two variants' requests are about the same size and the difference of their
times is the child's, not the fake's reading of longer requests."""
ANSWER = {"summary": "found"}
CHILD = {"summary": "the note says refunds are settled by the ledger", "findings": []}
PIPELINE = """
name = "bench-delegation"

[tools.read_note]
kind = "host"
function = "bench.delegation:read_note"

[[stages]]
name = "search"
output_schema = "orchestrator.pipelines.schemas:Summary"
tools = ["delegate", "read_note"]
delegate = { tools = ["read_note"] }
instruction = "Find it."
"""
NOTE = {"call": {"name": "read_note", "args": {"path": "a.py"}}}
DELEGATE = {"goal": "Read the note", "name": "note"}
SCRIPTS: dict[str, dict[str, Any]] = {
    "flat": {"search": [NOTE, NOTE, NOTE, {"json": ANSWER}]},
    "delegated": {
        "search": [{"call": {"name": "delegate", "args": DELEGATE}}, {"json": ANSWER}],
        "sub_note": [NOTE, {"json": CHILD}],
    },
    "kept": {
        "search": [{"call": {"name": "delegate", "args": {**DELEGATE, "keep": True}}},
                   {"json": ANSWER}],
        # Its first turn (the stored one), then this one's: steps go on after the history's.
        "sub_note": [NOTE, {"json": CHILD}, NOTE, {"json": CHILD}],
    },
}  # fmt: skip
KEPT = "sub_note"


def read_note(path: str) -> dict[str, Any]:
    """The maintainers' note on a file.

    Args:
        path: File, relative to the repository root.
    """
    return {"path": path, "note": "n" * NOTE_CHARS}


def run_once(
    inputs: StageInputs, script: dict[str, Any], children: Children | None = None
) -> tuple[float, int, int]:
    """One execution: its wall time in ms, its model calls and the size of the stage's last
    request."""
    fake = InProcessGemini({"agents": script})
    sinks = StageSinks(MemoryArtifacts(run_id="r1"), lambda entries: None, children=children)
    model = fake.model(transient_attempts=1)
    started = time.perf_counter()
    output = asyncio.run(execute_stage(inputs, model=model, sinks=sinks)).output
    took_ms = (time.perf_counter() - started) * 1000
    assert output == ANSWER, output
    last = [e for e in fake.requests() if e["agent"] == "search"][-1]
    return took_ms, sinks.usage.requests, len(json.dumps(last["request"]))


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("delegation: a stage with and without a child",
                             total=len(SCRIPTS) * REPEATS)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "pipeline.toml"
        spec.write_text(PIPELINE)
        pipeline = load_pipeline(str(spec))
    stage = pipeline.stage("search")
    inputs = StageInputs(
        run_id="r1", pipeline=pipeline.name, spec=stage, attempt=1, repo="unused",
        commit="0" * 40, state={ISSUE_KEY: "x"}, tools={"read_note": pipeline.tools["read_note"]},
    )  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    sizes: dict[str, int] = {}
    calls: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, services.redis_server(Path(tmp)) as url:
        client = redis.Redis.from_url(url, decode_responses=True)
        seeding = ChildStore(client, "seed")
        for script in SCRIPTS.values():  # warm-up: imports, schemas; the kept child's 1st turn
            run_once(inputs, script, seeding)
        first_turn = seeding.load(KEPT)
        assert first_turn.events, "the kept child's first turn was not stored"
        for number in range(REPEATS):  # interleaved, so a busy moment of the machine hits all
            for name, script in SCRIPTS.items():
                children = ChildStore(client, f"run{number}")  # the child of a run of its own
                children.save(KEPT, first_turn)
                took_ms, calls[name], sizes[name] = run_once(inputs, script, children)
                times[name].append(took_ms)
                progress.advance(task)
        client.close()
    variants = {
        name: {
            "p50_ms": round(statistics.median(times[name]), 2),
            "p95_ms": round(percentile(times[name], 0.95), 2),
            "model_calls": calls[name],
            "last_request_chars": sizes[name],
        }
        for name in SCRIPTS
    }
    child_ms = variants["delegated"]["p50_ms"] - variants["flat"]["p50_ms"]
    kept_ms = variants["kept"]["p50_ms"] - variants["delegated"]["p50_ms"]
    return {"repeats": REPEATS, "variants": variants, "child_overhead_ms": round(child_ms, 2),
            "kept_overhead_ms": round(kept_ms, 2)}  # fmt: skip


HEADER = ["variant", "model calls", "p50 (ms)", "p95 (ms)", "stage's last request (chars)"]
HISTORY = ["flat p50 (ms)", "delegated p50 (ms)", "a child's overhead (ms)", "kept p50 (ms)",
           "keeping's overhead (ms)"]  # fmt: skip


def latest(source: Source) -> str:
    """Both variants of the latest recorded run, and the difference."""
    rows = [
        [
            name,
            str(v["model_calls"]),
            f"{v['p50_ms']:.1f}",
            f"{v['p95_ms']:.1f}",
            f"{v['last_request_chars']:,}",
        ]
        for name, v in source["variants"].items()
    ]
    setup = f"{source['repeats']} executions a variant, in-process fake Gemini"
    text = (
        f"{latest_run(source, setup)}:\n\n{table(HEADER, rows)}\n\n"
        f"Delegating made the stage {_change(source, 'child_overhead_ms')} at p50 than making "
        "the same model calls in the stage itself"
    )
    if source["child_overhead_ms"] < 0:
        text += (" (starting the child cost less than the flat stage's longer requests, or less "
                 "than the run's noise)")  # fmt: skip
    text += "."
    if source.get("kept_overhead_ms") is not None:
        text += (f" Asking a kept child again made it {_change(source, 'kept_overhead_ms')} "
                 "than asking a fresh child.")  # fmt: skip
    return text


def _change(source: Source, key: str) -> str:
    """A difference of medians in words: `3.3 ms slower`, `0.7 ms faster`."""
    value = source[key]
    source.derive(abs(value))  # shown without its sign, which the words carry
    return f"{abs(value):.1f} ms {'slower' if value >= 0 else 'faster'}"


def _signed(source: Source, key: str) -> str:
    source.derive(abs(source[key]))  # a figure is read without its sign
    return f"{source[key]:+.1f}"


def row(source: Source) -> list[str]:
    v = source["variants"]
    kept = (
        [f"{v['kept']['p50_ms']:.1f}", _signed(source, "kept_overhead_ms")]
        if "kept" in v
        else ["-", "-"]
    )
    return [f"{v['flat']['p50_ms']:.1f}", f"{v['delegated']['p50_ms']:.1f}",
            _signed(source, "child_overhead_ms"), *kept]  # fmt: skip


SECTIONS = {"latest": latest}

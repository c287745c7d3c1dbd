"""`python -m bench.upstream`: what google-genai's request conversion spends walking its own
models, for requests as Baton sends them (docs/upstream.md, "Findings for upstream").

google-genai turns a request into the API's JSON with converters that read every field through
`google.genai._common.get_value_by_path(data, keys)`, which asks `key in data` first. A pydantic
model has no `__contains__`, so Python answers by iterating the model (`BaseModel.__iter__`,
every field) before the function falls back to `getattr`. Nothing of google-genai is replaced
here; for each request of `REQUESTS` this measures:

* **lookups**: the calls of `get_value_by_path` from the call of `generate_content` until the
  request reaches the HTTP transport, seen by a profile function (`sys.setprofile`);
* **walks**: the `in` tests that iterate a model: a call of `BaseModel.__iter__` made from
  `get_value_by_path`, with the fields it visits (the items it yields);
* **build CPU**: the process time from the call of `generate_content` to the transport, which
  stops the call there (what follows is the reply's handling); per request, the median of blocks;
* **walk CPU**: the request's walks replayed on the same models and keys (`key in model`), and
  beside them `getattr(model, key)` for the same fields, what reading them directly costs; the
  time of an empty loop over the same list is taken off both.

The requests are made as ADK makes a stage's (`LlmRequest.append_instructions`, `append_tools`
with Baton's code tools), sent as ADK sends them: prepared once by Baton's model
(`workers.gemini.build_model`, its HTTP client replaced by one whose transport stops every
request), then through `client.aio.models.generate_content`, the call ADK's `Gemini` makes.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from google.adk.models.llm_request import LlmRequest
from google.adk.tools import FunctionTool
from google.genai import _common, types
from pydantic import BaseModel, SecretStr

from bench.docs import Source, latest_run, table
from bench.record import SHARED
from orchestrator.core.pipeline import StageSpec, load_pipeline
from orchestrator.core.settings import ModelConfig, RetryConfig
from testkit.sinks import MemoryArtifacts
from testkit.workspace import LocalWorkspace
from workers.gemini import BatonGemini, build_model, close_model
from workers.output import contract
from workers.tools.code import build_tools

CODE: tuple[str, ...] = ("bench/upstream.py", "orchestrator/", "workers/", "testkit/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

PIPELINE = "fixer"
REQUESTS = {
    "plan: its call (JSON reply, no tools)": ("plan", 0),
    "fix: first call (tools)": ("fix", 0),
    "fix: last call of its budget": ("fix", None),
}
"""Each request measured: (stage of `PIPELINE`, tool steps before it; None: as many as the
stage's `max_model_calls` allows)."""
BLOCKS = 15
BUILDS_PER_BLOCK = 20
REPLAYS_PER_BLOCK = 20
LOOKUP = _common.get_value_by_path.__code__
MODEL_ITER = BaseModel.__iter__.__code__


class Sent(Exception):
    """Raised by `StopTransport` when a request reaches it: built, and about to go out."""


@dataclass
class StopTransport:
    """An httpx transport handler that takes each request and stops its call there."""

    sent_ns: int = 0
    """Process time when the last request arrived."""
    body: bytes = b""
    """The last request's body, as it would have gone out."""
    on_send: Callable[[], None] = lambda: None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent_ns = time.process_time_ns()
        self.on_send()
        self.body = request.content
        raise Sent


@dataclass
class Lookups:
    """What `get_value_by_path` did while counting (`counting`)."""

    lookups: int = 0
    walks: list[tuple[BaseModel, str]] = field(default_factory=list)
    """Each `in` test that iterated a model: the model and the key it looked for."""
    fields_visited: int = 0
    """Items the walks' `BaseModel.__iter__` yielded: its resumptions (a generator yields its
    first item when it starts, and each resumption yields the next or finds none left)."""
    walking_lookups: int = 0
    """Lookups that walked a model at least once."""


def _tested_key(key: str) -> str:
    """The name `get_value_by_path` tests with `in` for a path's key (`parts[]` → `parts`)."""
    for suffix in ("[]", "[0]"):
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


@contextmanager
def counting() -> Iterator[tuple[Lookups, Callable[[], None]]]:
    """Count `get_value_by_path`'s calls and walks in this thread until the block ends or the
    `stop` it yields is called. A profile function sees every Python call: a call of
    `get_value_by_path` is a lookup; a call of `BaseModel.__iter__` whose caller is
    `get_value_by_path` is a walk when its generator starts, and a field visited when it
    resumes."""
    found = Lookups()
    started: set[FrameType] = set()  # the walks' generator frames (kept: ids are reused)
    walking: set[FrameType] = set()

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        if frame.f_code is LOOKUP:
            found.lookups += 1
            return
        caller = frame.f_back
        if frame.f_code is not MODEL_ITER or caller is None or caller.f_code is not LOOKUP:
            return
        if frame in started:
            found.fields_visited += 1
            return
        started.add(frame)
        walking.add(caller)
        found.walks.append((frame.f_locals["self"], _tested_key(caller.f_locals["key"])))

    def stop() -> None:
        sys.setprofile(None)
        found.walking_lookups = len(walking)

    sys.setprofile(profile)
    try:
        yield found, stop
    finally:
        stop()


SIGNATURE = bytes(range(256))
"""A thought signature: opaque bytes the model gave with its call, sent back with it."""
FILE_TEXT = "".join(f"{n:4}| line {n} of the file\n" for n in range(1, 41))
"""A tool result's text: what a `read_file` call answers."""


def declared_tools(stage: StageSpec) -> list[FunctionTool]:
    """The stage's code tools as ADK declares them. Only their signatures and docstrings are
    read: the workspace and the artifact sink are never used."""
    workspace = LocalWorkspace(Path(tempfile.gettempdir()))
    return [FunctionTool(tool) for tool in build_tools(stage.tools, workspace, MemoryArtifacts())]


def conversation(stage: StageSpec, steps: int) -> list[types.Content]:
    """The stage's user message, then `steps` tool steps: a signed `read_file` call and its
    result."""
    contents = [
        types.Content(role="user", parts=[types.Part(text=f"Do the {stage.name} stage now.")])
    ]
    for step in range(steps):
        call = types.FunctionCall(name="read_file", args={"path": f"src/module_{step}.py"})
        answer = types.FunctionResponse(name="read_file", response={"content": FILE_TEXT})
        contents += [
            types.Content(
                role="model", parts=[types.Part(function_call=call, thought_signature=SIGNATURE)]
            ),
            types.Content(role="user", parts=[types.Part(function_response=answer)]),
        ]
    return contents


def llm_request(stage: StageSpec, steps: int, model: str) -> LlmRequest:
    """The request ADK makes for one of the stage's calls (`workers.agent.build_agent`): the
    stage's instruction (its placeholders as they are) and its reply's contract as the system
    instruction, its tools, or a JSON reply for a stage without tools."""
    config = types.GenerateContentConfig(
        response_mime_type=None if stage.tools else "application/json"
    )
    request = LlmRequest(model=model, contents=conversation(stage, steps), config=config)
    request.append_instructions(
        [stage.instruction.strip() + "\n\n" + contract(stage.schema_class())]
    )
    request.append_tools(list(declared_tools(stage)))
    return request


def stopping_model(transport: StopTransport) -> BatonGemini:
    """Baton's model, made as a worker makes it, with an HTTP client whose transport stops
    every request."""
    http_client = httpx.AsyncClient(transport=httpx.MockTransport(transport))
    cfg = ModelConfig(api_key=SecretStr("bench-upstream-key"))
    return build_model(cfg, RetryConfig(), http_client=http_client)


async def prepare(model: BatonGemini, request: LlmRequest) -> None:
    """Let the model (ADK's `Gemini`) prepare `request` in place as it does before every call
    (its headers, its API version); the transport stops the call."""
    try:
        async for _ in model.generate_content_async(request):
            break
    except Sent:
        return
    raise RuntimeError("the model answered without a request reaching the transport")


async def build(model: BatonGemini, request: LlmRequest) -> None:
    """One request built by google-genai as ADK's `Gemini` calls it, up to the transport."""
    try:
        await model.api_client.aio.models.generate_content(
            model=request.model or model.model,
            contents=request.contents,
            config=request.config,
        )
    except Sent:
        return
    raise RuntimeError("google-genai answered without a request reaching the transport")


async def count(model: BatonGemini, request: LlmRequest, transport: StopTransport) -> Lookups:
    """The lookups and walks of one build, until its request reaches the transport."""
    with counting() as (found, stop):
        transport.on_send = stop
        try:
            await build(model, request)
        finally:
            transport.on_send = lambda: None
    return found


async def build_cpu_us(model: BatonGemini, request: LlmRequest, transport: StopTransport) -> float:
    """Process time from the call to the transport, µs per build: the median of `BLOCKS`
    blocks of `BUILDS_PER_BLOCK`."""
    blocks = []
    for _ in range(BLOCKS):
        spent_ns = 0
        for _ in range(BUILDS_PER_BLOCK):
            started_ns = time.process_time_ns()
            await build(model, request)
            spent_ns += transport.sent_ns - started_ns
        blocks.append(spent_ns / BUILDS_PER_BLOCK / 1e3)
    return statistics.median(blocks)


def _in_tests(walks: list[tuple[BaseModel, str]]) -> None:
    for model, key in walks:
        # mypy knows a model has no `__contains__`; Python iterates it: the finding
        _ = key in model  # type: ignore[operator]


def _getattrs(walks: list[tuple[BaseModel, str]]) -> None:
    for model, key in walks:
        _ = getattr(model, key)


def _nothing(walks: list[tuple[BaseModel, str]]) -> None:
    for _model, _key in walks:
        pass


def replay_us(walks: list[tuple[BaseModel, str]]) -> tuple[float, float]:
    """Process time, µs, of the `in` tests of `walks` and of `getattr` for the same fields,
    with an empty loop's time taken off: the median of `BLOCKS` blocks of `REPLAYS_PER_BLOCK`
    replays, the three loops taking turns within each block."""
    samples: dict[Callable[..., None], list[float]] = {_in_tests: [], _getattrs: [], _nothing: []}
    for _ in range(BLOCKS):
        for loop, timed in samples.items():
            started_ns = time.process_time_ns()
            for _ in range(REPLAYS_PER_BLOCK):
                loop(walks)
            timed.append((time.process_time_ns() - started_ns) / REPLAYS_PER_BLOCK / 1e3)
    empty = statistics.median(samples[_nothing])
    return statistics.median(samples[_in_tests]) - empty, statistics.median(
        samples[_getattrs]
    ) - empty


async def measure(
    model: BatonGemini, request: LlmRequest, transport: StopTransport
) -> dict[str, Any]:
    """One request's figures."""
    await build(model, request)  # the first build fills google-genai's and pydantic's caches
    found = await count(model, request, transport)
    build_us = await build_cpu_us(model, request, transport)
    walks_us, getattr_us = replay_us(found.walks)
    return {
        "contents": len(request.contents),
        "tools": len(request.tools_dict),
        "lookups": found.lookups,
        "walking_lookups": found.walking_lookups,
        "walks": len(found.walks),
        "fields_visited": found.fields_visited,
        "build_us": round(build_us, 1),
        "walks_us": round(walks_us, 1),
        "getattr_us": round(getattr_us, 1),
        "walks_share": round(walks_us / build_us, 3),
    }


async def measure_all(advance: Callable[[], None]) -> dict[str, dict[str, Any]]:
    """Every request of `REQUESTS`, measured on one model."""
    transport = StopTransport()
    model = stopping_model(transport)
    stages = {stage.name: stage for stage in load_pipeline(PIPELINE).stages}
    figures = {}
    try:
        for name, (stage_name, steps) in REQUESTS.items():
            stage = stages[stage_name]
            made = stage.budget.max_model_calls - 1 if steps is None else steps
            request = llm_request(stage, made, model.model)
            await prepare(model, request)
            figures[name] = await measure(model, request, transport)
            advance()
    finally:
        await close_model(model)
    return figures


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("upstream: google-genai's request builds", total=len(REQUESTS))
    requests = asyncio.run(measure_all(lambda: progress.advance(task)))
    return {
        "google_genai": version("google-genai"),
        "pydantic": version("pydantic"),
        "python": platform.python_version(),
        "pipeline": PIPELINE,
        "blocks": BLOCKS,
        "builds_per_block": BUILDS_PER_BLOCK,
        "replays_per_block": REPLAYS_PER_BLOCK,
        "requests": requests,
    }


def walks(source: Source) -> str:
    """The latest run: each request's lookups, walks and their CPU time."""
    header = ["request", "contents", "lookups", "walks over a model", "fields visited",
              "CPU to build (µs)", "CPU in the walks (µs)", "share of the build",
              "`getattr` instead (µs)"]  # fmt: skip
    rows = [
        [name, str(r["contents"]), f"{r['lookups']:,}", f"{r['walks']:,}",
         f"{r['fields_visited']:,}", f"{r['build_us']:,.0f}", f"{r['walks_us']:,.0f}",
         f"{r['walks_share']:.1%}", f"{r['getattr_us']:,.0f}"]
        for name, r in source["requests"].items()
    ]  # fmt: skip
    setup = (
        f"google-genai {source['google_genai']}, pydantic {source['pydantic']}, "
        f"Python {source['python']}, the `{source['pipeline']}` pipeline's stages"
    )
    return (
        f"{latest_run(source, setup)}:\n\n{table(header, rows)}\n\n"
        "Lookups are the calls of `get_value_by_path` from the call of `generate_content` until "
        "the request reaches the HTTP transport; a walk is one of its `in` tests that iterates a "
        "model, and the fields visited are what those iterations yield. CPU is process time: "
        f"to build, the median of {source['blocks']} blocks of {source['builds_per_block']} "
        "builds; in the walks, the request's `in` tests replayed on the same models and keys "
        f"(the median of {source['blocks']} blocks of {source['replays_per_block']} replays, "
        "an empty loop's time taken off), and beside them `getattr` for the same fields."
    )


SECTIONS = {"walks": walks}


if __name__ == "__main__":
    from bench.__main__ import main

    sys.exit(main(["upstream", *sys.argv[1:]]))

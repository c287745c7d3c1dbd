"""Isolation: the same five-stage workload in one shared ADK session and in Baton.

Every stage reads three 20 KB files with a tool, then hands a short summary on. Variants:

  (a) ADK `SequentialAgent`, default contents: every stage sees every earlier stage's traffic;
  (b) the same with `include_contents='none'`;
  (c) (a) plus Baton's tool-output truncation and request trimming callbacks;
  (d) Baton: a Celery task and a fresh session per stage, hand-off through Redis;
  (e) (b) plus Baton's callbacks: ADK's strongest single-process set-up, in one session.

All five talk to the fake Gemini server through the real google-genai client; the figures are
the server's own token counts per request. Then (d) and (e) with the upstream stages reading ×1,
×4 and ×16 as much (3, 12 and 48 files each): the last stage's largest request should not move.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent, SequentialAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types
from pydantic import SecretStr

from bench.docs import Source, latest_run, table
from bench.record import SHARED, STACK
from bench.stack import API_KEY, bench_settings
from orchestrator.control import api
from orchestrator.core.git import COMMITTER, git_output
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.rules import StageBudget
from orchestrator.core.settings import ModelConfig, RetryConfig, Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env
from testkit.sinks import MemoryArtifacts
from testkit.workspace import LocalWorkspace
from workers.budget import request_trimmer, tool_output_limiter
from workers.gemini import build_model, close_model
from workers.tools.code import build_tools

CODE: tuple[str, ...] = (
    "bench/isolation.py",
    "bench/pipelines/isolation.toml",
    *STACK,
    "sandbox/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

STAGES = ["triage", "search", "plan", "fix", "pr"]
PIPELINE = Path(__file__).parent / "pipelines" / "isolation.toml"
READS_PER_STAGE = 3
FILE_LINES = 200
LINE_CHARS = 100
VOLUMES = (1, 4, 16)


def reads(stage: str, volume: int) -> int:
    """How many files a stage reads: the last stage always 3, the upstream ones 3 × volume."""
    return READS_PER_STAGE if stage == STAGES[-1] else READS_PER_STAGE * volume


def make_repo(dest: Path) -> Path:
    """The files every variant reads: 20 KB each."""
    blobs = dest / "blobs"
    blobs.mkdir(parents=True)
    for stage in STAGES:
        for i in range(1, reads(stage, max(VOLUMES)) + 1):
            line = f"{stage}-{i}-".ljust(LINE_CHARS - 1, "x")
            (blobs / f"{stage}_{i}.txt").write_text("\n".join([line] * FILE_LINES) + "\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "blobs"]):
        git_output(str(dest), ["-C", str(dest), *args], config=COMMITTER)
    return dest


def scenario(volume: int) -> dict[str, Any]:
    agents: dict[str, Any] = {}
    for stage in STAGES:
        calls = [
            {"call": {"name": "read_file", "args": {"path": f"blobs/{stage}_{i}.txt"}}}
            for i in range(1, reads(stage, volume) + 1)
        ]
        agents[stage] = [*calls, {"json": {"summary": f"{stage}: read {len(calls)} files."}}]
    return {"agents": agents}


def per_stage(entries: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    figures = {}
    for stage in STAGES:
        served = [e for e in entries if e["agent"] == stage and e["status"] == 200]
        figures[stage] = {
            "requests": len(served),
            "max_request_tokens": max((e["prompt_tokens"] for e in served), default=0),
            "prompt_tokens_total": sum(e["prompt_tokens"] for e in served),
        }
    return figures


def sequential_agent(
    model: Any, tools: list[Callable[..., Any]], *, contents: str, budget: StageBudget | None
) -> SequentialAgent:
    agents = []
    for index, stage in enumerate(STAGES):
        before = f"\nBefore you: {{{STAGES[index - 1]}_out?}}" if index else ""
        callbacks: dict[str, Any] = {}
        if budget is not None:
            callbacks = {
                "after_tool_callback": tool_output_limiter(budget.max_tool_output_chars),
                "before_model_callback": request_trimmer(budget.max_request_tokens),
            }
        agents.append(
            LlmAgent(
                name=stage,
                model=model,
                instruction=f"You are the {stage} stage. Read the files you need and summarize "
                f"them.{before}",
                tools=tools,
                output_key=f"{stage}_out",
                include_contents=contents,  # type: ignore[arg-type]
                **callbacks,
            )
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SequentialAgent(name="pipeline", sub_agents=agents)


async def run_sequential(
    fake_url: str, repo: Path, *, contents: str, budget: StageBudget | None
) -> None:
    model = build_model(ModelConfig(base_url=fake_url, api_key=SecretStr(API_KEY)), RetryConfig())
    tools = build_tools(["read_file"], LocalWorkspace(repo), MemoryArtifacts())
    runner = Runner(
        agent=sequential_agent(model, tools, contents=contents, budget=budget),
        app_name="bench",
        session_service=InMemorySessionService(),
    )
    session = await runner.session_service.create_session(app_name="bench", user_id="bench")
    message = types.Content(
        role="user", parts=[types.Part(text="Benchmark run: summarize the files.")]
    )
    async for _ in runner.run_async(user_id="bench", session_id=session.id, new_message=message):
        pass
    await runner.close()
    await close_model(model)


def run_baton(settings: Settings, repo: Path) -> None:
    run_id = api.enqueue(
        "Benchmark run: summarize the files.",
        repo=str(repo),
        pipeline=str(PIPELINE),
        settings=settings,
        force=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        run = api.get_run(run_id, settings=settings)
        if run.status.is_terminal:
            if run.status.value != "done":
                raise RuntimeError(f"benchmark run {run_id} ended {run.status.value}: {run.reason}")
            return
        time.sleep(0.1)
    raise TimeoutError(f"benchmark run {run_id} did not finish")


ADK_VARIANTS = {"a": ("default", False), "b": ("none", False), "c": ("default", True),
                "e": ("none", True)}  # fmt: skip
"""The one-session variants: contents, and whether Baton's budget callbacks are on."""
SCALED = ("d", "e")
"""The variants also run with the upstream stages reading ×4 and ×16."""

Volumes = dict[str, dict[str, dict[str, int]]]
"""Variant → `x<volume>` → the last stage's largest request and the total prompt tokens."""


def run(progress: Any) -> dict[str, Any]:
    budget = load_pipeline(str(PIPELINE)).stage("triage").budget
    variants: dict[str, dict[str, dict[str, int]]] = {}
    volumes: Volumes = {key: {} for key in SCALED}
    task = progress.add_task("isolation", total=len(ADK_VARIANTS) + 2 * len(VOLUMES) - 1)
    with (
        tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp,
        FakeGemini.start(scenario(1)) as fake,
    ):
        work = Path(tmp)
        repo = make_repo(work / "repo")

        def measure(key: str, volume: int, go: Callable[[], object]) -> None:
            progress.update(task, description=f"isolation: ({key}), upstream volume x{volume}")
            fake.set_scenario(scenario(volume))
            fake.reset()
            go()
            figures = per_stage(fake.requests())
            if volume == 1:
                variants[key] = figures
            if key in SCALED:
                volumes[key][f"x{volume}"] = {
                    "last_stage_max_request_tokens": figures[STAGES[-1]]["max_request_tokens"],
                    "prompt_tokens_total": sum(f["prompt_tokens_total"] for f in figures.values()),
                }
            progress.advance(task)

        for volume in VOLUMES:
            for key, (contents, callbacks) in ADK_VARIANTS.items():
                if volume == 1 or key in SCALED:
                    session = run_sequential(
                        fake.url, repo, contents=contents, budget=budget if callbacks else None
                    )
                    measure(key, volume, functools.partial(asyncio.run, session))
        with services.redis_server(work / "redis") as redis_url:
            settings = bench_settings(redis_url, fake.url, work)
            queues = [s.queue for s in load_pipeline(str(PIPELINE)).stages]
            with services.worker(worker_env(settings), queues, logfile=work / "worker.log"):
                for volume in VOLUMES:
                    measure("d", volume, functools.partial(run_baton, settings, repo))
    return summarize(variants, volumes)


def summarize(variants: dict[str, dict[str, dict[str, int]]], volumes: Volumes) -> dict[str, Any]:
    totals = {k: sum(s["prompt_tokens_total"] for s in v.values()) for k, v in variants.items()}

    def spread(key: str) -> float:
        last = [v["last_stage_max_request_tokens"] for v in volumes[key].values()]
        return round((max(last) - min(last)) / min(last), 4)

    return {
        "workload": {
            "stages": len(STAGES),
            "reads_per_stage": READS_PER_STAGE,
            "file_chars": FILE_LINES * LINE_CHARS,
        },
        "variants": variants,
        "prompt_tokens_total": totals,
        "baton_over_shared_session": round(totals["d"] / totals["a"], 4),
        "baton_over_adk_strongest": round(totals["d"] / totals["e"], 4),
        "volumes": volumes,
        "last_stage_spread": {key: spread(key) for key in SCALED},
    }


NAMES = {
    "a": "(a) SequentialAgent, default contents",
    "b": "(b) SequentialAgent, include_contents='none'",
    "c": "(c) (a) + Baton's truncation and trimming",
    "e": "(e) (b) + Baton's truncation and trimming",
    "d": "(d) Baton over Celery + Redis",
}


HISTORY = [
    "(a) total", "(b) total", "(c) total", "(e) total", "(d) Baton total", "(d) / (a)",
    "(d) / (e)", "(d) last stage max req ×1 / ×4 / ×16", "(e) last stage max req ×1 / ×4 / ×16",
    "spread (d) / (e)",
]  # fmt: skip
"""The history table's columns after the date and commit (`row`)."""


def _last(source: Source, key: str) -> str:
    volumes = source["volumes"][key]
    return " / ".join(f"{v['last_stage_max_request_tokens']:,}" for v in volumes.values())


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    totals, spread = source["prompt_tokens_total"], source["last_stage_spread"]
    return [
        *(f"{totals[k]:,}" for k in ("a", "b", "c", "e", "d")),
        f"{source['baton_over_shared_session']:.1%}",
        f"{source['baton_over_adk_strongest']:.1%}",
        _last(source, "d"),
        _last(source, "e"),
        f"{spread['d']:.1%} / {spread['e']:.1%}",
    ]


def latest(source: Source) -> str:
    """The latest run: per variant and stage, then by upstream volume."""
    totals = source["prompt_tokens_total"]
    rows = [
        [
            name,
            *(f"{source['variants'][key][s]['max_request_tokens']:,}" for s in STAGES),
            f"{totals[key]:,}",
            f"{source.derive(totals[key] / totals['a']):.1%}",
            f"{source.derive(totals[key] / totals['e']):.1%}",
        ]
        for key, name in NAMES.items()
    ]
    header = ["variant", *(f"{s} max req" for s in STAGES), "total prompt tokens", "of (a)",
              "of (e)"]  # fmt: skip
    volumes = source["volumes"]
    by_volume = table(
        ["upstream volume", *(f"{NAMES[k][:3]} last stage's max request" for k in SCALED),
         *(f"{NAMES[k][:3]} total prompt tokens" for k in SCALED)],
        [
            [x, *(f"{volumes[k][x]['last_stage_max_request_tokens']:,}" for k in SCALED),
             *(f"{volumes[k][x]['prompt_tokens_total']:,}" for k in SCALED)]
            for x in volumes["d"]
        ],
    )  # fmt: skip
    return (
        f"{latest_run(source)}, per stage (largest request in tokens), then by upstream "
        f"volume:\n\n{table(header, rows)}\n\n{by_volume}"
    )


def summary(source: Source) -> str:
    """What the README says of the latest run."""
    work, totals = source["workload"], source["prompt_tokens_total"]
    last = {v["last_stage_max_request_tokens"] for v in source["volumes"]["d"].values()}
    same = (
        f"the same, {next(iter(last)):,} tokens," if len(last) == 1
        else f"between {min(last):,} and {max(last):,} tokens"
    )  # fmt: skip
    volumes = [x.replace("x", "×") for x in source["volumes"]["d"]]
    return (
        f"Measured ({source.stamp}; `python -m bench isolation`): on {work['stages']} stages each "
        f"reading {work['reads_per_stage']} files of {work['file_chars']:,} characters, Baton "
        f"sent {source['baton_over_shared_session']:.1%} of the prompt tokens of an ADK "
        f"`SequentialAgent` with default contents ({totals['d']:,} against {totals['a']:,}), and "
        f"{source['baton_over_adk_strongest']:.1%} of ADK's strongest single-process set-up "
        f"(`include_contents='none'` with Baton's two budget callbacks, {totals['e']:,}). The last "
        f"stage's largest request was {same} whether the stages before it read "
        f"{', '.join(volumes[:-1])} or {volumes[-1]} as much."
    )


SECTIONS = {"latest": latest, "summary": summary}

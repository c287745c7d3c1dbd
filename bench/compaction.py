"""Compaction against trimming alone on one long stage (`python -m bench compaction`).

A scripted `search` stage makes 40 tool calls, each returning a page of a log of about 3,000
characters, under a 12,000-token request budget, then answers. Only the first page holds a line
marked as a fact (`FACT`). The stage runs twice on the fake Gemini, through the real
google-genai client and Baton's own agent (`workers.agent`): once with `compaction` (default
settings: the trigger is the budget, two exchanges kept verbatim), once with trimming alone. The
fake's summariser (`{"extract": "FACT:"}`) keeps the lines of its request that hold the marker,
so the fact can reach the stage's last request only through a summary Baton asked for with the
first page in it.

Per run: the stage's model calls and the summaries', the largest request as the fake counted
it, the prompt tokens of every request together, and whether the fact reached the last request.
tests/workers/test_compaction.py runs the same stage and asserts what these figures show.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from bench.docs import Source, latest_run, table
from bench.record import SHARED
from orchestrator.core.rules import CompactionRule, StageBudget
from orchestrator.core.settings import ModelConfig, RetryConfig
from testkit.gemini import FakeGemini
from workers.agent import AgentSpec, StageSession, Usage, build_agent
from workers.gemini import build_model, close_model

CODE: tuple[str, ...] = ("bench/compaction.py", "orchestrator/", "workers/", "testkit/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

STAGE = "search"
SUMMARISER = f"{STAGE}.compaction"
"""The agent name Baton gives the stage's summariser: `<stage>.compaction`."""
TOOL_CALLS = 40
BUDGET_TOKENS = 12_000
PAGE_LINES = 60
FACT = "FACT: refunds are settled by the ledger service of team Kestrel"
ANSWER = {"owner": "team Kestrel"}
LABELS = {"session": f"run:{STAGE}:1", "stage": STAGE}
SCENARIO: dict[str, Any] = {
    "agents": {
        STAGE: [
            *({"call": {"name": "read_page", "args": {"number": n}}} for n in range(TOOL_CALLS)),
            {"json": ANSWER},
        ],
        SUMMARISER: [{"extract": "FACT:"}],
    }
}


def read_page(number: int) -> dict[str, Any]:
    """Read one page of the service's log.

    Args:
        number: The page, from 0.
    """
    lines = [f"{number:02d}-{i:03d} handled in {i % 17} ms, all well" for i in range(PAGE_LINES)]
    if number == 0:
        lines.insert(7, FACT)
    return {"page": number, "text": "\n".join(lines)}


@dataclass
class Run:
    """One execution of the stage: its reply and everything the fake and Baton recorded."""

    reply: str = ""
    usage: Usage = field(default_factory=Usage)
    audit: list[dict[str, Any]] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    """The requests as Baton's `record_request` saw them."""
    sent: list[dict[str, Any]] = field(default_factory=list)
    """The fake's record of every request, oldest first."""

    def of(self, agent: str) -> list[dict[str, Any]]:
        return [entry for entry in self.sent if entry["agent"] == agent]


def run_stage(
    fake: FakeGemini, compaction: CompactionRule | None, *, max_model_calls: int = 60
) -> Run:
    """Run the stage once on `fake` (its record reset first)."""
    fake.reset()
    run = Run()
    spec = AgentSpec(
        name=STAGE,
        instruction="Find which team settles refunds.",
        contract="Reply with JSON.",
        budget=StageBudget(max_request_tokens=BUDGET_TOKENS, max_model_calls=max_model_calls),
        tools=[read_page],
        record_request=run.recorded.append,
        compaction=compaction,
        audit=lambda entries: run.audit.extend({**LABELS, **e} for e in entries),
    )

    async def execute() -> str:
        model = build_model(ModelConfig(base_url=fake.url, api_key=SecretStr("k")), RetryConfig())
        try:
            async with StageSession.open(
                build_agent(spec, model, run.usage),
                session_id=LABELS["session"],
                state={},
                audit=run.audit.extend,
                labels=LABELS,
                usage=run.usage,
            ) as session:
                message = f"Do the {STAGE} stage now."
                return await session.turn(message, max_model_calls=max_model_calls)
        finally:
            await close_model(model)
            run.sent = fake.requests()

    run.reply = asyncio.run(execute())
    return run


def figures_of(run: Run) -> dict[str, Any]:
    """What the docs show of one run."""
    last = run.of(STAGE)[-1]["request"]
    return {
        "stage_calls": len(run.of(STAGE)),
        "summaries": len(run.of(SUMMARISER)),
        "largest_request_tokens": max(entry["prompt_tokens"] for entry in run.sent),
        "prompt_tokens_total": sum(entry["prompt_tokens"] for entry in run.sent),
        "fact_in_last_request": FACT in json.dumps(last),
        "answered": json.loads(run.reply) == ANSWER,
    }


def run(progress: Any) -> dict[str, Any]:
    task = progress.add_task("compaction: one long stage, compacted and trimmed", total=2)
    results: dict[str, Any] = {}
    with FakeGemini.start(SCENARIO) as fake:
        for name, rule in (("compaction", CompactionRule()), ("trimming", None)):
            results[name] = figures_of(run_stage(fake, rule))
            progress.advance(task)
    return {"tool_calls": TOOL_CALLS, "budget_tokens": BUDGET_TOKENS, "runs": results}


def _rows(source: Source) -> list[list[str]]:
    return [
        [
            name,
            str(f["stage_calls"]),
            str(f["summaries"]),
            f"{f['largest_request_tokens']:,}",
            f"{f['prompt_tokens_total']:,}",
            "yes" if f["fact_in_last_request"] else "**no**",
        ]
        for name, f in source["runs"].items()
    ]


HEADER = ["history kept by", "stage's calls", "summaries", "largest request (tokens)",
          "prompt tokens in all", "first page's fact in the last request"]  # fmt: skip
HISTORY = ["compaction: largest request", "fact kept", "trimming: largest request", "fact kept"]
"""The history table's columns after the date and commit (`row`)."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    cells = []
    for name in ("compaction", "trimming"):
        f = source["runs"][name]
        cells += [f"{f['largest_request_tokens']:,}", "yes" if f["fact_in_last_request"] else "no"]
    return cells


def latest(source: Source) -> str:
    """Both runs of the latest recorded benchmark, side by side."""
    setup = (
        f"{source['tool_calls']} tool calls under a budget of "
        f"{source['budget_tokens']:,} tokens a request"
    )
    return f"{latest_run(source, setup)}:\n\n{table(HEADER, _rows(source))}"


SECTIONS = {"latest": latest}

"""Budgets inside a stage, end to end: tool outputs cut, outputs compacted, long histories
summarised, SSE token counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from demo import SENTRY_EVENT
from orchestrator.control.inspection import tokens, whole_audit
from orchestrator.core.models import RunStatus
from orchestrator.core.store import RunStore
from tests.repos import Git

from .conftest import Stack, demo_scenario, stack_settings, start_worker

FIXER = (
    Path(__file__).resolve().parents[2] / "orchestrator" / "pipelines" / "fixer" / "pipeline.toml"
)


def with_agents(**scripts: list[dict[str, Any]]) -> dict[str, Any]:
    scenario = demo_scenario()
    for agent, steps in scripts.items():
        scenario["agents"][agent] = {"steps": steps}
    return scenario


def add_big_file(git: Git, bare: Path, scratch: Path) -> None:
    """Push a commit with a 30 KB file to the sample repository."""
    git("clone", "-q", bare, scratch)
    lines = [f"LINE_{i:04d} = '{'x' * 90}'" for i in range(300)]
    (scratch / "shopcart" / "catalog.py").write_text("\n".join(lines) + "\n")
    for args in (["add", "-A"], ["commit", "-qm", "catalog"], ["push", "-q"]):
        git(*args, cwd=scratch)


def test_a_huge_tool_output_reaches_the_model_cut_with_a_marker(
    stack: Stack, tmp_path: Path, git: Git
) -> None:
    repo = stack.sample_repo()
    add_big_file(git, repo, tmp_path / "scratch")
    search = demo_scenario()["agents"]["search"]["steps"]
    read_big = {"call": {"name": "read_file", "args": {"path": "shopcart/catalog.py"}}}
    stack.fake.set_scenario(with_agents(search=[read_big, *search[1:]]))

    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.DONE, run.reason
    second = stack.requests("search")[1]["request"]
    response = second["contents"][2]["parts"][0]["functionResponse"]["response"]
    assert response["truncated"].startswith("tool output cut to fit the budget: ")
    assert len(json.dumps(response)) <= 8_000 + 200
    assert "LINE_0000" in json.dumps(response)


def test_an_output_over_budget_is_summarized_by_a_model_call(
    stack: Stack, run_store: RunStore
) -> None:
    plan = dict(demo_scenario()["agents"]["plan"]["steps"][0]["json"])
    short = dict(plan)
    plan["approach"] = "Return 0 for an empty cart. " * 200
    stack.fake.set_scenario(with_agents(plan=[{"json": plan}], compactor=[{"json": short}]))

    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    assert run.stages["plan"].compacted == "summarized"
    assert run_store.output(run.id, "plan") == short
    compactor = stack.requests("compactor")
    assert len(compactor) == 1
    assert "Return 0 for an empty cart. " * 50 in json.dumps(compactor[0]["request"]["contents"])
    assert run.stages["plan"].requests == 2


def test_a_failed_summary_falls_back_to_cutting_with_markers(
    stack: Stack, run_store: RunStore
) -> None:
    plan = dict(demo_scenario()["agents"]["plan"]["steps"][0]["json"])
    plan["approach"] = "Return 0 for an empty cart. " * 200
    stack.fake.set_scenario(with_agents(plan=[{"json": plan}], compactor=[{"text": "not json"}]))

    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    assert run.stages["plan"].compacted == "truncated"
    kept = run_store.output(run.id, "plan")
    assert kept is not None
    assert kept["approach"].startswith("Return 0 for an empty cart. ")
    assert "…[cut " in kept["approach"]
    assert kept["test_command"] == plan["test_command"]
    assert run.stages["plan"].output_chars <= 3_000


def test_a_long_search_is_summarised_by_its_own_model_and_audited(
    stack: Stack, run_store: RunStore, tmp_path: Path
) -> None:
    head, triage, search = FIXER.read_text().split("[[stages]]")[:3]  # the run ends after search
    compacting = search.replace(
        "budget = { max_model_calls = 10, max_request_tokens = 12000, max_output_chars = 3000 }",
        "budget = { max_model_calls = 20, max_request_tokens = 2500, max_output_chars = 3000 }\n"
        'compaction = { overlap = 1, model = "gemini-summariser-lite", max_summary_tokens = 300 }',
    )
    pipeline = tmp_path / "fixer-compacting.toml"
    pipeline.write_text("[[stages]]".join([head, triage, compacting]))
    read = {"call": {"name": "read_file", "args": {"path": "shopcart/cart.py"}}}
    read_tests = {"call": {"name": "read_file", "args": {"path": "tests/test_cart.py"}}}
    answer = demo_scenario()["agents"]["search"]["steps"][-1]
    stack.fake.set_scenario(
        with_agents(
            search=[read, *[read_tests] * 6, answer],
            **{"search.compaction": [{"extract": "def average_price_cents"}]},
        )
    )

    run = stack.wait(
        stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo(), pipeline=str(pipeline))
    )

    assert run.status == RunStatus.DONE, run.reason
    summaries = stack.requests("search.compaction")
    assert summaries and {entry["model"] for entry in summaries} == {"gemini-summariser-lite"}
    last = stack.requests("search")[-1]["request"]
    assert "def average_price_cents(self) -> int:" in json.dumps(last["contents"][0])
    assert run.stages["search"].requests == len(stack.requests("search")) + len(summaries)
    audited = [e for e in whole_audit(run_store, run.id, stage="search") if e.kind == "compaction"]
    assert [e.author for e in audited] == ["search.compaction"] * len(summaries)
    assert all(e.parts[0].text == "def average_price_cents(self) -> int:" for e in audited)
    made = [c.made for c in tokens(run, audited).calls]
    assert made == ["summary"] * len(summaries)


def test_streamed_replies_count_tokens_once(
    redis_url: str, fake_server: Any, tmp_path: Path
) -> None:
    # Its own database, so the shared worker of the other tests never takes these stages.
    settings = stack_settings(redis_url.rsplit("/", 1)[0] + "/2", fake_server, tmp_path)
    stack = Stack(settings, fake_server, tmp_path)
    fake_server.set_scenario(demo_scenario())
    fake_server.reset()
    with start_worker(settings, tmp_path / "worker.log", BATON_STREAMING="true"):
        run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    assert run.status == RunStatus.DONE, run.reason
    assert all(entry["stream"] for entry in stack.requests())
    for stage in ("triage", "search", "fix"):
        served = stack.requests(stage)
        assert run.stages[stage].requests == len(served)
        assert run.stages[stage].prompt_tokens_total == sum(e["prompt_tokens"] for e in served)
        # Thinking is billed as output: the reply's thoughts count with its candidates.
        output = sum(e["candidates_tokens"] + e["thoughts_tokens"] for e in served)
        assert run.stages[stage].output_tokens == output

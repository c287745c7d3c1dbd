"""A pipeline whose stages run on two providers, for real: a Celery worker process, one stage on
the fake OpenAI-compatible server through LiteLLM's client, the next on the fake Gemini through
google-genai. Each server answers its first call with its own provider's 429 (`Retry-After`
and `x-ratelimit-reset-requests`; `RetryInfo.retryDelay`), and Celery retries each stage at the
delay asked; the fleet's governor keeps the two models' quotas and cooldowns under keys of
their own; no key shows up in anything recorded.

The test starts its own worker on its own Redis database, so the shared session worker never
sees its queues.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core import keys
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.settings import DEFAULT_MODEL, Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.openai import FakeOpenAI
from testkit.services import worker_env

from .conftest import CANARY_KEY

DATABASE = 15
"""This module's Redis database: flushed before the test, never used by the shared worker."""
OPENAI_KEY = "sk-openai-canary-key-9876543210"
OPENAI_MODEL = "openai/gpt-fake-mini"
GEMINI_MODEL = DEFAULT_MODEL
OPENAI_DELAY_S = 3
GEMINI_DELAY_S = 2
JITTER_S = 1.0
"""`RetryConfig.rate_limit_jitter_s`: the most Baton adds to a server's delay."""
OVERHEAD_S = 2.5
"""Generous room for Celery to take the retried message and the stage to start again."""
PIPELINE = f"""
name = "mixed"
description = "Triage on an OpenAI-compatible server, the fix on Gemini."
model = "{GEMINI_MODEL}"

[[stages]]
name = "mx_triage"
model = "{OPENAI_MODEL}"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Summarize the report in one sentence.\\n{{issue}}"

[[stages]]
name = "mx_fix"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Shorten this summary: {{mx_triage}}"
"""
TRIAGED = {"summary": "Checkout divides the price in cents by 100 twice."}
FIXED = {"summary": "Cents divided twice."}


@pytest.fixture
def servers() -> Iterator[tuple[FakeOpenAI, FakeGemini]]:
    openai_scenario = {
        "agents": {"mx_triage": [{"json": TRIAGED}]},
        "faults": [{"agent": "mx_triage", "requests": [1], "status": 429,
                    "retry_after_s": OPENAI_DELAY_S, "reset_requests": "6m0s"}],
    }  # fmt: skip
    gemini_scenario = {
        "agents": {"mx_fix": [{"json": FIXED}]},
        "faults": [{"agent": "mx_fix", "requests": [1], "status": 429,
                    "retry_delay_s": GEMINI_DELAY_S}],
    }  # fmt: skip
    with (
        FakeOpenAI.start(openai_scenario, api_key=OPENAI_KEY) as openai_fake,
        FakeGemini.start(gemini_scenario) as gemini_fake,
    ):
        yield openai_fake, gemini_fake


def run_watching_cooldowns(
    settings: Settings, pipeline: Path, repo: Path, client: redis.Redis
) -> tuple[RunRecord, dict[str, float]]:
    """Enqueue one run and wait for it to end, looking at the fleet's cooldown keys meanwhile;
    the run and when each cooldown key was first seen."""
    run_id = api.enqueue("Checkout totals are off by a factor of 100.", repo=str(repo),
                         pipeline=str(pipeline), settings=settings, force=True)  # fmt: skip
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for key in client.scan_iter(match=keys.cooldown("*")):
            seen.setdefault(key.decode(), time.time())
        run = api.get_run(run_id, settings=settings)
        if run.status.is_terminal:
            return run, seen
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not end within 60 s")


def quota_tokens(client: redis.Redis, model: str) -> list[int]:
    """The token counts of the calls the governor holds in `model`'s window."""
    return sorted(
        int(member.rsplit(b":", 1)[1]) for member in client.zrange(keys.quota(model), 0, -1)
    )


@pytest.mark.timeout(120)
def test_a_mixed_pipeline_retries_each_providers_429_at_its_delay_and_keeps_quotas_apart(
    redis_url: str, servers: tuple[FakeOpenAI, FakeGemini], tmp_path: Path
) -> None:
    openai_fake, gemini_fake = servers
    url = redis_url.rsplit("/", 1)[0] + f"/{DATABASE}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    settings = Settings(
        redis_url=url,
        gemini_base_url=gemini_fake.url,
        google_api_key=SecretStr(CANARY_KEY),
        repo_cache_dir=tmp_path / "cache",
    )
    pipeline = tmp_path / "mixed.toml"
    pipeline.write_text(PIPELINE)
    quota = {"requests_per_minute": 100, "tokens_per_minute": 100_000}
    env = {
        **worker_env(settings),
        "OPENAI_API_KEY": OPENAI_KEY,
        "BATON_OPENAI_BASE_URL": openai_fake.base_url,
        "BATON_QUOTAS": json.dumps({OPENAI_MODEL: quota, GEMINI_MODEL: quota}),
        "BATON_KEEP_MODEL_REQUESTS": "true",
    }
    log = tmp_path / "worker.log"
    queues = ["baton.mixed.mx_triage", "baton.mixed.mx_fix"]
    with services.worker(env, queues, logfile=log, name="mixed"):
        run, cooldowns = run_watching_cooldowns(
            settings, pipeline, make_sample_repo(tmp_path / "repo"), client
        )

    assert run.status is RunStatus.DONE, run.reason
    to_openai, to_gemini = openai_fake.requests(), gemini_fake.requests()
    assert [(e["agent"], e["status"]) for e in to_openai] == [
        ("mx_triage", 429),
        ("mx_triage", 200),
    ]
    assert [(e["agent"], e["status"]) for e in to_gemini] == [("mx_fix", 429), ("mx_fix", 200)]
    assert all(e["model"] == "gpt-fake-mini" and e["authorized"] for e in to_openai)

    # Celery put each stage back at its own server's delay (plus Baton's jitter), once.
    openai_waited = to_openai[1]["ts"] - to_openai[0]["ts"]
    gemini_waited = to_gemini[1]["ts"] - to_gemini[0]["ts"]
    assert OPENAI_DELAY_S <= openai_waited <= OPENAI_DELAY_S + JITTER_S + OVERHEAD_S
    assert GEMINI_DELAY_S <= gemini_waited <= GEMINI_DELAY_S + JITTER_S + OVERHEAD_S
    triage, fix = run.stages["mx_triage"], run.stages["mx_fix"]
    assert (triage.attempts, triage.rate_limit_retries) == (2, 1)
    assert (fix.attempts, fix.rate_limit_retries) == (2, 1)
    assert OPENAI_DELAY_S <= triage.rate_limit_wait_s <= OPENAI_DELAY_S + JITTER_S
    assert GEMINI_DELAY_S <= fix.rate_limit_wait_s <= GEMINI_DELAY_S + JITTER_S

    # Each stage's tokens are its own provider's usage.
    served_openai, served_gemini = to_openai[1], to_gemini[1]
    assert (triage.prompt_tokens_total, triage.output_tokens) == (
        served_openai["prompt_tokens"], served_openai["completion_tokens"],
    )  # fmt: skip
    assert (fix.prompt_tokens_total, fix.output_tokens) == (
        served_gemini["prompt_tokens"],
        served_gemini["candidates_tokens"] + served_gemini["thoughts_tokens"],
    )

    # The governor: a cooldown and a quota window per provider and model, never shared.
    assert set(cooldowns) == {keys.cooldown(OPENAI_MODEL), keys.cooldown(GEMINI_MODEL)}
    assert cooldowns[keys.cooldown(OPENAI_MODEL)] < cooldowns[keys.cooldown(GEMINI_MODEL)]
    openai_total = served_openai["prompt_tokens"] + served_openai["completion_tokens"]
    gemini_total = (served_gemini["prompt_tokens"] + served_gemini["candidates_tokens"]
                    + served_gemini["thoughts_tokens"])  # fmt: skip
    openai_window, gemini_window = (
        quota_tokens(client, OPENAI_MODEL),
        quota_tokens(client, GEMINI_MODEL),
    )
    assert len(openai_window) == len(gemini_window) == 2  # the refused call and the served one
    assert openai_total in openai_window and openai_total not in gemini_window
    assert gemini_total in gemini_window and gemini_total not in openai_window

    # No key in any request body, log line, audit entry or artifact.
    store = RunStore.from_url(url)
    artifacts = [ref for stage in run.stages.values() for ref in stage.artifacts.values()]
    recorded = [
        json.dumps(to_openai), json.dumps(to_gemini), log.read_text(errors="replace"),
        json.dumps(store.audit_log(run.id)), *(store.artifact(ref).decode() for ref in artifacts),
    ]  # fmt: skip
    assert len(recorded) == 4 + 2  # each stage kept its model requests
    for text in recorded:
        assert OPENAI_KEY not in text and CANARY_KEY not in text
    store.redis.close()
    client.close()

"""A real prefork worker serves Prometheus metrics summed over its pool processes, scraped over
HTTP; every pool process runs one stage and exits (`--max-tasks-per-child 1`), so the sums only
come out right if the samples of exited processes still count."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from demo import SENTRY_EVENT
from orchestrator.core.models import RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import DEFAULT_MODEL
from testkit import services
from testkit.services import worker_env

from .conftest import Stack, stack_settings

STAGES = [stage.name for stage in load_pipeline("fixer").stages]
MODEL = {"model": DEFAULT_MODEL}
"""The label of the model the workers use."""


@pytest.fixture
def metered(redis_url: str, stack: Stack, tmp_path: Path) -> Iterator[tuple[Stack, str, Path]]:
    """A worker of its own (Redis database 14, 2 pool processes, metrics on a free port) over
    the shared fake server; yields a stack for it, its metrics URL and its samples directory."""
    url = redis_url.rsplit("/", 1)[0] + "/14"
    redis.Redis.from_url(url).flushdb()
    settings = stack_settings(url, stack.fake, tmp_path)
    port, directory, log = services.free_port(), tmp_path / "metrics", tmp_path / "worker.log"
    env = {
        **worker_env(settings),
        "BATON_METRICS_PORT": str(port),
        "BATON_METRICS_DIR": str(directory),
    }
    queues = [stage.queue for stage in load_pipeline("fixer").stages]
    options = ["--max-tasks-per-child", "1"]
    try:
        with services.worker(
            env, queues, concurrency=2, logfile=log, name="baton-metrics", options=options
        ):
            yield (
                Stack(settings, stack.fake, tmp_path),
                f"http://127.0.0.1:{port}/metrics",
                directory,
            )
    finally:
        stack.fake.set_faults([])


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample called `name`, by its labels."""
    return {
        frozenset(s.labels.items()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text, name).get(frozenset(labels.items()), 0.0)


def writers(directory: Path, prefix: str) -> set[str]:
    """The pids of the processes that wrote files `<prefix>_<pid>.db`."""
    return {p.stem.rsplit("_", 1)[1] for p in directory.glob(f"{prefix}_*.db")}


def settled(directory: Path, executions: int, timeout_s: float = 30.0) -> None:
    """Wait until `executions` pool processes have timed their stage and every one has
    exited (Celery's `worker_process_shutdown` removes its live gauge file)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(writers(directory, "histogram")) >= executions and not writers(
            directory, "gauge_livesum"
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"pool processes did not settle: {sorted(directory.iterdir())}")


@pytest.mark.timeout(300)
def test_a_prefork_worker_serves_metrics_summed_over_every_pool_process(
    metered: tuple[Stack, str, Path],
) -> None:
    stack, url, directory = metered
    stack.fake.set_faults([{"agent": "plan", "requests": [1], "status": 429, "retry_delay_s": 1}])
    done = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()), 180)
    stack.fake.set_faults([{"agent": "triage", "status": 403}])
    failed = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    stack.fake.set_faults([])
    executions = 7 + 1 + 1  # seven stages done, plan retried after its 429, triage failed
    settled(directory, executions)
    text = httpx.get(url, timeout=10).text

    assert done.status == RunStatus.DONE, done.reason
    assert failed.status == RunStatus.FAILED and failed.reason is not None
    assert "403" in failed.reason
    assert len(writers(directory, "histogram")) == executions, "one pool process per execution"

    durations = samples(text, "baton_stage_duration_seconds_count")
    expected: dict[frozenset[tuple[str, str]], float] = {
        frozenset({"pipeline": "fixer", "stage": name, "outcome": "done"}.items()): 1
        for name in STAGES
    }
    expected[frozenset({"pipeline": "fixer", "stage": "plan", "outcome": "retried"}.items())] = 1
    expected[frozenset({"pipeline": "fixer", "stage": "triage", "outcome": "failed"}.items())] = 1
    assert durations == expected
    assert samples(text, "baton_stage_failures_total") == {
        frozenset({"stage": "triage", "reason": "model_rejected"}.items()): 1
    }

    requests = stack.requests()
    assert {e["agent"] for e in requests} == set(STAGES)
    for name in STAGES:
        sent = stack.requests(name)
        replied = [e for e in sent if e["status"] == 200]
        assert value(text, "baton_model_calls_total", stage=name, **MODEL) == len(sent), name
        prompt = value(text, "baton_model_tokens_total", stage=name, kind="prompt", **MODEL)
        output = value(text, "baton_model_tokens_total", stage=name, kind="output", **MODEL)
        assert prompt == sum(e["prompt_tokens"] for e in replied) > 0, name
        thought = sum(e["candidates_tokens"] + e["thoughts_tokens"] for e in replied)
        assert output == thought > 0, name  # thinking is billed as output
    assert sum(samples(text, "baton_model_calls_total").values()) == len(requests)
    refused = [e for e in requests if e["status"] == 429]
    assert value(text, "baton_model_rate_limited_total", **MODEL) == len(refused) == 1

    lifetimes = samples(text, "baton_sandbox_lifetime_seconds_count")
    # reproduce: its own and the one its test is run in; fix: its own and two for the proof
    sandboxes = {"search": 1, "reproduce": 2, "fix": 3, "pr": 1}
    assert lifetimes == {frozenset({"stage": name}.items()): n for name, n in sandboxes.items()}
    assert all(v > 0 for v in samples(text, "baton_sandbox_lifetime_seconds_sum").values())
    assert not samples(text, "baton_stages_in_progress"), "no pool process that ran is alive"

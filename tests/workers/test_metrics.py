"""Worker metrics: prometheus_client's real multiprocess mode, with samples written by forked
processes and summed by the process that serves them; and why a stage failed.

prometheus_client picks its mode when it is first imported, so every multiprocess check runs in
a fresh interpreter (`run_script`), never in the test process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery.exceptions import SoftTimeLimitExceeded
from google.genai import errors as genai_errors
from prometheus_client.parser import text_string_to_metric_families

import sandbox
from orchestrator.core.facts import Fact, TestRun
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.rules import VerifyRule
from orchestrator.pipelines.fixer.schemas import Plan
from workers import errors as workers_errors
from workers import output, stage
from workers.errors import (
    FAILURE_REASONS,
    ModelCallLimitError,
    NotReproducedError,
    ProofFailedError,
    PublishError,
    QuotaWaitError,
    StageCancelledError,
    StageError,
)
from workers.execution import as_execution_error
from workers.gemini import model_error
from workers.metrics import failure_reason

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import json, multiprocessing, os, signal, sys, time, urllib.request
from pathlib import Path
from workers import metrics
from workers.errors import ModelRejectedError

def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()

def exiting():
    metrics.process_exited(os.getpid())  # what Celery's worker_process_shutdown does

def forked(target, *args):
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    return process
"""


def run_script(body: str, *args: str) -> Any:
    """Run `body` after `PRELUDE` in a fresh interpreter; what it prints, as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with exactly these labels, None if there is none."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_samples_of_several_forked_processes_add_up_on_the_served_endpoint(
    tmp_path: Path,
) -> None:
    shown = run_script(
        """
        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")

        def child(n):
            for _ in range(n):
                metrics.model_call("gemini-x", "triage")
            metrics.tokens_used("gemini-x", "triage", prompt=100 * n, output=10 * n)
            metrics.rate_limited("gemini-x")
            metrics.quota_wait("gemini-x", 1.5)
            metrics.sandbox_closed("fix", 3.0 * n)
            metrics.stage_finished("triage", "fixer", "done", 2.0)
            metrics.stage_failed("plan", "output_invalid")
            exiting()

        for process in [forked(child, n) for n in (1, 2, 3)]:
            process.join()
        print(json.dumps({"text": scrape(port), "files": sorted(os.listdir(sys.argv[1]))}))
        metrics.close()
        """,
        str(tmp_path / "metrics"),
    )
    text = shown["text"]

    model = {"model": "gemini-x"}
    assert sample(text, "baton_model_calls_total", stage="triage", **model) == 6
    assert sample(text, "baton_model_tokens_total", stage="triage", kind="prompt", **model) == 600
    assert sample(text, "baton_model_tokens_total", stage="triage", kind="output", **model) == 60
    assert sample(text, "baton_model_rate_limited_total", **model) == 3
    assert sample(text, "baton_quota_wait_seconds_total", **model) == 4.5
    assert sample(text, "baton_sandbox_lifetime_seconds_count", stage="fix") == 3
    assert sample(text, "baton_sandbox_lifetime_seconds_sum", stage="fix") == 18.0
    assert sample(text, "baton_sandbox_lifetime_seconds_bucket", stage="fix", le="5.0") == 1
    done = {"pipeline": "fixer", "stage": "triage", "outcome": "done"}
    assert sample(text, "baton_stage_duration_seconds_count", **done) == 3
    assert sample(text, "baton_stage_failures_total", stage="plan", reason="output_invalid") == 3
    writers = {name.removesuffix(".db").rsplit("_", 1)[1] for name in shown["files"]}
    assert len(writers) == 3, f"each process writes files of its own: {shown['files']}"


def test_the_stage_timer_records_each_outcome_and_why_a_stage_failed(tmp_path: Path) -> None:
    shown = run_script(
        """
        from celery.exceptions import Retry

        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")

        def run(how):
            try:
                with metrics.stage_timer("plan", "fixer") as timer:
                    if how == "retried":
                        raise Retry("429")
                    if how in ("failed", "cancelled"):
                        timer.settled(how, ModelRejectedError("403"))
                    if how == "crashed":
                        raise KeyError("bug")
            except (Retry, KeyError):
                pass
            exiting()

        hows = ["done", "done", "retried", "failed", "cancelled", "crashed"]
        for process in [forked(run, how) for how in hows]:
            process.join()
        print(json.dumps(scrape(port)))
        metrics.close()
        """,
        str(tmp_path / "metrics"),
    )

    def count(outcome: str) -> float | None:
        labels = {"pipeline": "fixer", "stage": "plan", "outcome": outcome}
        return sample(shown, "baton_stage_duration_seconds_count", **labels)

    assert (count("done"), count("retried"), count("failed"), count("cancelled")) == (2, 1, 2, 1)
    failures = {
        reason: sample(shown, "baton_stage_failures_total", stage="plan", reason=reason)
        for reason in ("model_rejected", "cancelled", "internal")
    }
    assert failures == {"model_rejected": 1, "cancelled": 1, "internal": 1}
    assert sample(shown, "baton_stages_in_progress", stage="plan") is None, "no live process"


def test_stages_in_progress_count_live_processes_only(tmp_path: Path) -> None:
    shown = run_script(
        """
        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")
        fork = multiprocessing.get_context("fork")
        started, release = fork.Semaphore(0), fork.Event()

        def running(stage):
            with metrics.stage_timer(stage, "fixer"):
                metrics.model_call("gemini-x", stage)
                started.release()
                release.wait(30)
            exiting()

        def killed(stage):
            with metrics.stage_timer(stage, "fixer"):
                metrics.model_call("gemini-x", stage)
                os.kill(os.getpid(), signal.SIGKILL)

        held = [forked(running, "fix"), forked(running, "fix")]
        forked(killed, "fix").join()
        for _ in held:
            started.acquire(timeout=30)
        during = scrape(port)
        release.set()
        for process in held:
            process.join()
        print(json.dumps({"during": during, "after": scrape(port)}))
        metrics.close()
        """,
        str(tmp_path / "metrics"),
    )

    calls = {"model": "gemini-x", "stage": "fix"}
    assert sample(shown["during"], "baton_model_calls_total", **calls) == 3
    assert sample(shown["during"], "baton_stages_in_progress", stage="fix") == 2
    assert sample(shown["after"], "baton_stages_in_progress", stage="fix") is None
    assert sample(shown["after"], "baton_model_calls_total", **calls) == 3, "the killed one too"


def test_prepare_empties_the_directory_of_samples_of_an_earlier_worker(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_4242.db").write_bytes(b"\0" * 64)
    (directory / "keep.txt").write_text("not a sample")

    shown = run_script(
        """
        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")
        print(json.dumps({"files": sorted(os.listdir(sys.argv[1])), "text": scrape(port)}))
        metrics.close()
        """,
        str(directory),
    )

    assert shown["files"] == ["keep.txt"]
    assert not {n for n in names(shown["text"]) if n.startswith("baton_")}
    assert directory.is_dir(), "a directory it was given stays"


def test_a_directory_of_its_own_is_removed_when_the_worker_closes() -> None:
    shown = run_script(
        """
        made = metrics.prepare()
        metrics.serve(0, host="127.0.0.1")
        before = made.is_dir() and os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(made)
        metrics.close()
        print(json.dumps([before, made.exists()]))
        """
    )

    assert shown == [True, False]


def test_prepare_switches_a_prometheus_client_imported_earlier_to_multiprocess_mode(
    tmp_path: Path,
) -> None:
    shown = run_script(
        """
        import flower.events  # what the `celery` command imports before any Baton code

        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")

        def child():
            metrics.rate_limited("gemini-x")
            exiting()

        for process in [forked(child), forked(child)]:
            process.join()
        print(json.dumps(scrape(port)))
        metrics.close()
        """,
        str(tmp_path / "metrics"),
    )

    assert sample(shown, "baton_model_rate_limited_total", model="gemini-x") == 2


def test_serving_on_a_port_in_use_says_which_setting_to_change(tmp_path: Path) -> None:
    shown = run_script(
        """
        from orchestrator.core.errors import ConfigError
        metrics.prepare(Path(sys.argv[1]))
        port = metrics.serve(0, host="127.0.0.1")
        try:
            metrics.serve(port, host="127.0.0.1")
        except ConfigError as exc:
            print(json.dumps(str(exc)))
        metrics.close()
        """,
        str(tmp_path / "metrics"),
    )

    assert "BATON_METRICS_PORT" in shown


# Why a stage failed: exceptions made by the code paths that raise them, where that is cheap.


def api_error(code: int, status: str) -> genai_errors.APIError:
    return genai_errors.APIError(code, {"error": {"code": code, "message": "no", "status": status}})


def classified(exc: BaseException) -> BaseException:
    mapped = model_error(exc)
    assert mapped is not None
    return mapped


def raised(make: Callable[[], object]) -> BaseException:
    with pytest.raises(BaseException) as caught:
        make()
    return caught.value


def ended(exc: BaseException) -> BaseException:
    """`exc` as the stage task sees it once it ended an execution of the fix stage."""
    return as_execution_error(exc, load_pipeline("fixer").stage("fix"))


def fix_with_failing_tests() -> None:
    verified = VerifyRule(command_from="plan.test_command")  # the fixer's proof decides instead
    fix = load_pipeline("fixer").stage("fix").model_copy(update={"verify": verified})
    before = TestRun(command="pytest", exit_code=1, passed=2, failed=2)
    after = TestRun(command="pytest", exit_code=1, passed=3, failed=1)
    stage._require_passing_tests(fix, {Fact.TESTS_BEFORE: before, Fact.TESTS_AFTER: after})


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: classified(api_error(403, "PERMISSION_DENIED")), "model_rejected"),
        (lambda: classified(api_error(400, "INVALID_ARGUMENT")), "model_rejected"),
        (lambda: classified(api_error(503, "UNAVAILABLE")), "model_unavailable"),
        (lambda: classified(httpx.ConnectTimeout("slow")), "model_unavailable"),
        (lambda: classified(api_error(429, "RESOURCE_EXHAUSTED")), "rate_limited"),
        (lambda: QuotaWaitError("the quota keeps the call waiting", 90.0), "rate_limited"),
        (lambda: ModelCallLimitError("reached its budget of 8 model calls"), "model_call_limit"),
        (lambda: raised(lambda: output.parse("not json", Plan)), "output_invalid"),
        (lambda: raised(fix_with_failing_tests), "tests_failed"),
        (lambda: ProofFailedError("the change is not proven: …"), "proof_failed"),
        (lambda: NotReproducedError("could not reproduce the report: …"), "not_reproduced"),
        (lambda: PublishError("cannot push baton/x"), "publish_failed"),
        (lambda: ended(sandbox.SandboxStartError("image missing")), "stage_error"),
        (lambda: ended(sandbox.SandboxUnavailableError("daemon restarted")), "infrastructure"),
        (lambda: ended(SoftTimeLimitExceeded()), "time_limit"),
        (lambda: ended(asyncio.CancelledError()), "cancelled"),
        (lambda: StageCancelledError(), "cancelled"),
        (lambda: StageError("stage 'fix' made 4 bad tool calls"), "stage_error"),
        (lambda: ended(KeyError("stages")), "internal"),
        (lambda: KeyError("stages"), "internal"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_failure_is_counted_under_the_reason_its_exception_names(
    make: Callable[[], BaseException], reason: str
) -> None:
    assert failure_reason(make()) == reason


def test_every_error_class_names_a_known_reason() -> None:
    """Each `ExecutionError` subclass counts under one of the documented label values."""
    classes = [workers_errors.ExecutionError]
    for cls in classes:
        classes.extend(cls.__subclasses__())
    assert {cls.reason for cls in classes} <= set(FAILURE_REASONS)
    assert set(FAILURE_REASONS) == {
        "model_rejected", "model_unavailable", "model_call_limit", "output_invalid",
        "tests_failed", "proof_failed", "not_reproduced", "publish_failed", "rate_limited",
        "infrastructure", "time_limit", "cancelled", "lost", "stage_error", "internal",
        "budget_exceeded",
    }  # fmt: skip

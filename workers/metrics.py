"""Prometheus metrics of a worker, correct under Celery's prefork pool.

Every pool process writes its samples to files of its own in one directory (prometheus_client's
multiprocess mode); the worker's main process serves their sum on `/metrics`
(`BATON_METRICS_PORT`). Counters and histograms of a pool process that has exited keep
counting; the gauge of stages in progress counts live processes only.

prometheus_client picks its mode once, when it is first imported, from
`PROMETHEUS_MULTIPROC_DIR`, and the `celery` command imports it before any Baton code (Flower's
`celery flower` plugin does, when the command starts). So `prepare()`, in the worker's main
process before the pool forks (Celery's `celeryd_init`), sets that variable and makes
prometheus_client choose again; and this module imports prometheus_client only when a metric
is first used.

    baton_stage_duration_seconds{pipeline,stage,outcome}  histogram  one execution of a stage;
                                          outcome: done, failed, retried,
                                          cancelled, lost
    baton_stages_in_progress{stage}       gauge (livesum)  executions running now (absent
                                          once every process that ran one has exited)
    baton_stage_failures_total{stage,reason}   counter   reasons: `workers.errors.Reason`
    baton_model_calls_total{stage,model}       counter   requests sent to the model API
    baton_model_tokens_total{stage,model,kind} counter   kind: prompt or output, as replied
    baton_model_rate_limited_total{model}      counter   429 answers
    baton_quota_wait_seconds_total{model}      counter   time slept for the quota or a cooldown
    baton_sandbox_lifetime_seconds{stage}      histogram  from creating a sandbox to its removal
    baton_run_budget_cost_usd_total{model}     counter   estimated cost of the calls of runs
                                          with a budget (priced models only)
    baton_run_budget_stops_total{limit}        counter   model calls and subagents a run's
                                          budget refused; limit: calls, tokens, cost,
                                          wall, iterations, handoffs

Labels never hold a run id: each one takes a handful of values.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar
from wsgiref.simple_server import WSGIServer

from celery.exceptions import Retry

from orchestrator.core.errors import ConfigError
from workers.errors import ExecutionError, Reason

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

T = TypeVar("T")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
Outcome = Literal["done", "failed", "retried", "cancelled", "lost"]
DURATION_BUCKETS_S = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
LIFETIME_BUCKETS_S = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


def failure_reason(exc: BaseException) -> Reason:
    """Why a stage did not finish: the error's own reason (`workers.errors`); `internal` for
    anything that is not an `ExecutionError`."""
    return exc.reason if isinstance(exc, ExecutionError) else "internal"


# What the code records (one-liners at the places where things happen).


@dataclass
class StageTimer:
    """What became of one execution of a stage; `stage_timer` records it when its block ends."""

    outcome: Outcome = "done"
    error: BaseException | None = None

    def settled(self, outcome: Outcome, error: BaseException) -> None:
        """The stage did not finish: it failed or was cancelled because of `error`."""
        self.outcome, self.error = outcome, error


@contextmanager
def stage_timer(stage: str, pipeline: str) -> Iterator[StageTimer]:
    """Time one execution of a stage and count it in progress while it runs.

    A block that ends normally is `done` unless `StageTimer.settled` said otherwise; Celery's
    `Retry` leaving it is `retried`; any other exception leaving it is `failed`, for the
    reason that exception names (`internal`, mostly).
    """
    timer, started = StageTimer(), time.monotonic()
    in_progress = _metrics().in_progress.labels(stage)
    in_progress.inc()
    try:
        yield timer
    except Retry:
        timer.outcome = "retried"
        raise
    except Exception as exc:
        timer.settled("failed", exc)
        raise
    finally:
        in_progress.dec()
        stage_finished(stage, pipeline, timer.outcome, time.monotonic() - started)
        if timer.outcome == "cancelled":
            stage_failed(stage, "cancelled")
        elif timer.outcome == "failed" and timer.error is not None:
            stage_failed(stage, failure_reason(timer.error))


def stage_finished(stage: str, pipeline: str, outcome: Outcome, duration_s: float) -> None:
    _metrics().stage_duration.labels(pipeline, stage, outcome).observe(duration_s)


def stage_failed(stage: str, reason: Reason) -> None:
    _metrics().stage_failures.labels(stage, reason).inc()


def model_call(model: str, stage: str) -> None:
    """One request is about to go to the model API (each retry of a call is one more)."""
    _metrics().model_calls.labels(stage, model).inc()


def tokens_used(model: str, stage: str, *, prompt: int, output: int) -> None:
    """The token counts of one model reply."""
    tokens = _metrics().model_tokens
    tokens.labels(stage, model, "prompt").inc(prompt)
    tokens.labels(stage, model, "output").inc(output)


def rate_limited(model: str) -> None:
    """The model API answered 429."""
    _metrics().rate_limited.labels(model).inc()


def quota_wait(model: str, seconds: float) -> None:
    """A model call slept this long for the fleet's quota, a cooldown or a 429."""
    if seconds > 0:
        _metrics().quota_wait.labels(model).inc(seconds)


def budget_cost(model: str, cost_usd: float) -> None:
    """A call of a run with a budget cost about this much (`orchestrator.core.prices`)."""
    if cost_usd > 0:
        _metrics().budget_cost.labels(model).inc(cost_usd)


def budget_stop(limit: str) -> None:
    """A run's budget refused a model call; `limit` says which one (`calls`, `tokens`, ...)."""
    _metrics().budget_stops.labels(limit).inc()


def sandbox_closed(stage: str, lifetime_s: float) -> None:
    _metrics().sandbox_lifetime.labels(stage).observe(lifetime_s)


@contextmanager
def sandbox_lifetime(stage: str, started: AbstractContextManager[T]) -> Iterator[T]:
    """Enter `started` (`DockerSandbox.start(...)`) and record the sandbox's lifetime, from
    before its creation to after its removal, once it is removed; nothing if it never started."""
    began, entered = time.monotonic(), False
    try:
        with started as box:
            entered = True
            yield box
    finally:
        if entered:
            sandbox_closed(stage, time.monotonic() - began)


@dataclass(frozen=True)
class _Metrics:
    stage_duration: Histogram
    in_progress: Gauge
    stage_failures: Counter
    model_calls: Counter
    model_tokens: Counter
    rate_limited: Counter
    quota_wait: Counter
    sandbox_lifetime: Histogram
    budget_cost: Counter
    budget_stops: Counter


@cache
def _metrics() -> _Metrics:
    """The metrics, made on first use: prometheus_client is imported here, after `prepare`.

    They are in no registry: the worker's main process serves what the files say.
    """
    from prometheus_client import Counter, Gauge, Histogram

    return _Metrics(
        stage_duration=Histogram(
            "baton_stage_duration_seconds", "Duration of one execution of a stage.",
            ["pipeline", "stage", "outcome"], buckets=DURATION_BUCKETS_S, registry=None,
        ),
        in_progress=Gauge(
            "baton_stages_in_progress", "Stage executions running now.",
            ["stage"], multiprocess_mode="livesum", registry=None,
        ),
        stage_failures=Counter(
            "baton_stage_failures", "Stage executions that failed or were cancelled, by reason.",
            ["stage", "reason"], registry=None,
        ),
        model_calls=Counter(
            "baton_model_calls", "Requests sent to the model API, retries included.",
            ["stage", "model"], registry=None,
        ),
        model_tokens=Counter(
            "baton_model_tokens", "Tokens of model replies (kind: prompt or output).",
            ["stage", "model", "kind"], registry=None,
        ),
        rate_limited=Counter(
            "baton_model_rate_limited", "429 answers of the model API.", ["model"], registry=None
        ),
        quota_wait=Counter(
            "baton_quota_wait_seconds", "Time model calls slept for the quota or a cooldown.",
            ["model"], registry=None,
        ),
        sandbox_lifetime=Histogram(
            "baton_sandbox_lifetime_seconds", "Time from creating a sandbox to its removal.",
            ["stage"], buckets=LIFETIME_BUCKETS_S, registry=None,
        ),
        budget_cost=Counter(
            "baton_run_budget_cost_usd", "Estimated cost of the model calls of runs with a "
            "budget.", ["model"], registry=None,
        ),
        budget_stops=Counter(
            "baton_run_budget_stops", "Model calls a run's budget refused, by limit.",
            ["limit"], registry=None,
        ),
    )  # fmt: skip


# The worker's side: the directory, the endpoint, processes that exit.


@dataclass
class _Serving:
    directory: Path
    owned: bool
    """The directory was made by `prepare` and goes with `close`."""
    server: WSGIServer | None = None


_serving: _Serving | None = None


def prepare(directory: Path | None = None) -> Path:
    """Make this process, and the pool processes it forks, write samples to files in
    `directory` (emptied of earlier samples) or in a fresh temporary directory. Call it in the
    worker's main process before the pool starts, and before any metric is used."""
    global _serving
    if directory is None:
        path, owned = Path(tempfile.mkdtemp(prefix="baton-metrics-")), True
    else:
        path, owned = directory, False
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    if "prometheus_client.values" in sys.modules:
        _choose_multiprocess_values()
    _serving = _Serving(path, owned)
    return path


def _choose_multiprocess_values() -> None:
    """prometheus_client was imported already, maybe in single-process mode (see the module
    docstring): make it choose again, now that the variable is set. It has no API for this
    (prometheus/client_python#701, #886); every metric reads `values.ValueClass` when it makes
    a value."""
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()


def serve(port: int, *, host: str = "0.0.0.0") -> int:
    """Serve the sum of every process's samples on `http://host:port/metrics` from a thread
    of this process (after `prepare`). Returns the port (useful with 0)."""
    from prometheus_client import CollectorRegistry, start_http_server

    if _serving is None:
        raise ConfigError("workers.metrics.serve needs workers.metrics.prepare first")
    registry = CollectorRegistry()
    registry.register(_Collector(_serving.directory))
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror}); "
            "set BATON_METRICS_PORT to a free port"
        ) from exc
    _serving.server, bound = server, server.server_port
    logger.info("serving metrics on %s:%d from %s", host, bound, _serving.directory)
    return bound


def process_exited(pid: int) -> None:
    """A pool process is exiting: its live gauges stop counting (its counters stay)."""
    if _serving is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(_serving.directory))


def close() -> None:
    """Stop serving; remove the directory if `prepare` made it."""
    global _serving
    if _serving is None:
        return
    if _serving.server is not None:
        _serving.server.shutdown()
        _serving.server.server_close()
    if _serving.owned:
        shutil.rmtree(_serving.directory, ignore_errors=True)
    _serving = None


class _Collector:
    """prometheus_client's `MultiProcessCollector`, which first forgets the live gauges of
    processes that died without saying so (killed, say)."""

    def __init__(self, directory: Path) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._directory = directory
        self._files = MultiProcessCollector(None, path=str(directory))

    def collect(self) -> Iterable[Metric]:
        from prometheus_client import multiprocess

        for pid in _live_gauge_pids(self._directory):
            if not _alive(pid):
                multiprocess.mark_process_dead(pid, str(self._directory))
        return self._files.collect()


def _live_gauge_pids(directory: Path) -> set[int]:
    """Processes with live gauges (files `gauge_live<mode>_<pid>.db`)."""
    stems = (p.stem.rsplit("_", 1)[-1] for p in directory.glob("gauge_live*_*.db"))
    return {int(stem) for stem in stems if stem.isdigit()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and another user's
        pass
    return True

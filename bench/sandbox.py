"""Sandbox start-up cost: a whole `DockerSandbox` use against a bare `docker run`.

Interleaved in one run, `RUNS` times each (the order alternates between rounds):

  (1) `with DockerSandbox.start(cfg) as box: box.exec(["true"])`: create and start a hardened
      container, run one command through the exec path (wrapper, deadline reader, inspect),
      remove the container and its workspace volume;
  (2) `docker run --rm IMAGE true` through the CLI: no hardening, no volume, no exec.

The figure of interest is (1) / (2): the sandbox should cost no more than a bare `docker run`.
The phases of (1) are timed too: start (create + start), exec, removal.

Then the warm pool (`sandbox.pool.WarmPool`, one ready container): `RUNS` times, once the pool
has refilled, the time from asking `pool.start(cfg)` to holding a sandbox (renamed for the
execution that took it), against (1)'s cold start. Target: warm p50 at most 50 ms.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import time
from typing import Any

import docker

from bench import record
from sandbox import IMAGE_TAG, DockerSandbox, SandboxConfig, ensure_image
from sandbox.pool import WarmPool

RUNS = 30
WARMUP = 2
MAX_WARM_MS = 50.0
EXECUTION = {"baton.run": "bench-pool", "baton.stage": "fix", "baton.attempt": "1"}
"""The labels a stage gives its sandbox: a taken one is renamed for them."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sandbox_use(client: docker.DockerClient, cfg: SandboxConfig) -> dict[str, float]:
    """One whole use of a sandbox, and its phases, in seconds."""
    started = time.perf_counter()
    with DockerSandbox.start(cfg, labels={"baton.bench": "sandbox"}, client=client) as box:
        ready = time.perf_counter()
        result = box.exec(["true"])
        ran = time.perf_counter()
    done = time.perf_counter()
    if result.exit_code != 0:
        raise RuntimeError(f"`true` failed in the sandbox: {result.output}")
    return {
        "total": done - started,
        "start": ready - started,
        "exec": ran - ready,
        "remove": done - ran,
    }


def docker_run(image: str) -> float:
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", image, "true"], check=True, capture_output=True)
    return time.perf_counter() - started


def one_round(
    client: docker.DockerClient, cfg: SandboxConfig, *, sandbox_first: bool
) -> tuple[dict[str, float], float]:
    if sandbox_first:
        use = sandbox_use(client, cfg)
        return use, docker_run(cfg.image)
    seconds = docker_run(cfg.image)
    return sandbox_use(client, cfg), seconds


def run(progress: Any) -> dict[str, Any]:
    if shutil.which("docker") is None:
        raise RuntimeError("the docker CLI is needed for the baseline: apt-get install docker.io")
    task = progress.add_task("sandbox: image", total=2 * RUNS)
    client = docker.from_env()
    try:
        ensure_image(client=client, progress=lambda line: progress.update(task, description=line))
        progress.update(task, description="sandbox: start → exec → remove vs docker run")
        cfg = SandboxConfig(image=IMAGE_TAG)
        phases: dict[str, list[float]] = {"total": [], "start": [], "exec": [], "remove": []}
        cli: list[float] = []
        for i in range(WARMUP + RUNS):
            use, seconds = one_round(client, cfg, sandbox_first=i % 2 == 0)
            if i < WARMUP:
                continue
            for name, value in use.items():
                phases[name].append(value)
            cli.append(seconds)
            progress.advance(task, 2)
        progress.update(task, description="sandbox: acquire from the warm pool")
        warm = pool_acquires(client, cfg)
    finally:
        client.close()
    return summarize(phases, cli, warm)


def pool_acquires(client: docker.DockerClient, cfg: SandboxConfig) -> list[float]:
    """Seconds from asking the warm pool for a sandbox to holding it, each once it refilled."""
    pool = WarmPool(size=1, client=client)
    acquired = []
    try:
        with pool.start(cfg, labels={"baton.bench": "pool"}, env={}):  # tells it the config
            pass
        for _ in range(WARMUP + RUNS):
            deadline = time.monotonic() + 30
            while pool.ready() < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the warm pool did not refill within 30 s")
                time.sleep(0.01)
            started = time.perf_counter()
            with pool.start(cfg, labels=EXECUTION, env={}) as box:
                acquired.append(time.perf_counter() - started)
                box.exec(["true"])
    finally:
        pool.close()
    return acquired[WARMUP:]


def summarize(
    phases: dict[str, list[float]], cli: list[float], warm: list[float]
) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 1),
            "p95_ms": round(1000 * percentile(values, 0.95), 1),
            "n": len(values),
        }

    figures: dict[str, Any] = {
        "sandbox": stats(phases["total"]),
        "docker_run": stats(cli),
        "phases": {name: stats(phases[name]) for name in ("start", "exec", "remove")},
    }
    for q in ("p50", "p95"):
        ratio = figures["sandbox"][f"{q}_ms"] / figures["docker_run"][f"{q}_ms"]
        figures[f"ratio_{q}"] = round(ratio, 2)
    figures["warm_acquire"] = stats(warm)
    warm_p50 = figures["warm_acquire"]["p50_ms"]
    figures["targets"] = {
        "warm_acquire_p50_ms": {"target": f"<= {MAX_WARM_MS}", "value": warm_p50,
                                "met": warm_p50 <= MAX_WARM_MS},
    }  # fmt: skip
    return figures


def write(figures: dict[str, Any]) -> None:
    s, d, phases = figures["sandbox"], figures["docker_run"], figures["phases"]
    w = figures["warm_acquire"]
    detail = record.table(
        ["", "runs", "p50 (ms)", "p95 (ms)"],
        [
            ["DockerSandbox: start → exec(true) → removal", str(s["n"]), _ms(s["p50_ms"]),
             _ms(s["p95_ms"])],
            ["… of which start (create + start)", str(s["n"]), _ms(phases["start"]["p50_ms"]),
             _ms(phases["start"]["p95_ms"])],
            ["… of which exec(true)", str(s["n"]), _ms(phases["exec"]["p50_ms"]),
             _ms(phases["exec"]["p95_ms"])],
            ["… of which removal", str(s["n"]), _ms(phases["remove"]["p50_ms"]),
             _ms(phases["remove"]["p95_ms"])],
            ["docker run --rm IMAGE true (CLI)", str(d["n"]), _ms(d["p50_ms"]), _ms(d["p95_ms"])],
            ["warm pool: ask → holding a sandbox", str(w["n"]), _ms(w["p50_ms"]),
             _ms(w["p95_ms"])],
        ],
    )  # fmt: skip
    row = [
        _ms(s["p50_ms"]),
        _ms(s["p95_ms"]),
        _ms(d["p50_ms"]),
        _ms(d["p95_ms"]),
        f"{figures['ratio_p50']:.2f}×",
        f"{figures['ratio_p95']:.2f}×",
        _ms(w["p50_ms"]),
        _ms(phases["start"]["p50_ms"]),
    ]
    record.save("sandbox", figures, row, detail)


def _ms(value: float) -> str:
    return f"{value:.0f}"

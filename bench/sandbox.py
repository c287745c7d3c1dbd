"""Sandbox start-up cost: a whole `DockerSandbox` use against a bare `docker run`, on each
sandbox host (OCI runtime).

Interleaved in one run, `RUNS` times each (the order rotates between rounds):

  (1) `with DockerSandbox.start(cfg) as box: box.exec(["true"])`: create and start a hardened
      container, run one command through the exec path (wrapper, deadline reader, inspect),
      remove the container and its workspace volume — under runc, dockerd's default;
  (1') the same under gVisor's `runsc` (`SandboxConfig.runtime`; docs/sandboxes.md, "Sandbox
      hosts");
  (1'') the same through the sandbox gate started with `--runtime runsc`: Compose's sandbox
      host, where no worker holds dockerd's socket (images/README.md);
  (2) `docker run --rm IMAGE true` through the CLI: no hardening, no volume, no exec.

The figure of interest is (1) / (2): the sandbox should cost no more than a bare `docker run`;
(1') / (1) is what gVisor's user-space kernel costs at start. The phases of (1) and (1') are
timed too: start (create + start), exec, removal.

Then the warm pool (`sandbox.pool.WarmPool`, one ready container): `RUNS` times, once the pool
has refilled, the time from asking `pool.start(cfg)` to holding a sandbox (renamed for the
execution that took it), against (1)'s cold start. Target: warm p50 at most 50 ms.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import docker

from bench import record
from bench.docs import Source, latest_run, table, targets_table
from bench.record import SHARED
from sandbox import IMAGE_TAG, DockerSandbox, SandboxConfig, ensure_image
from sandbox.pool import WarmPool
from testkit import services

CODE: tuple[str, ...] = ("bench/sandbox.py", "sandbox/", "images/", "testkit/", *SHARED)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

RUNS = 30
WARMUP = 2
GATED = "gate + runsc"
RUNTIMES: dict[str, str | None] = {"runc": None, "runsc": "runsc", GATED: None}
"""The sandbox hosts compared, by name: dockerd's default runtime, then gVisor, which dockerd
must have registered (scripts/with-docker.sh does), then the sandbox gate, which puts the
sandbox under runsc itself (the sandbox asks for no runtime)."""
PHASES = ("total", "start", "exec", "remove")
CLI = "docker run"
MAX_WARM_MS = 50.0
EXECUTION = {"baton.run": "bench-pool", "baton.stage": "fix", "baton.attempt": "1"}
"""The labels a stage gives its sandbox: a taken one is renamed for them."""


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
    clients: dict[str, docker.DockerClient],
    configs: dict[str, SandboxConfig],
    *,
    rotation: int,
) -> tuple[dict[str, dict[str, float]], float]:
    """One sandbox use per host and one `docker run`, in an order that rotates by round."""
    jobs: dict[str, Callable[[], Any]] = {
        name: partial(sandbox_use, clients[name], cfg) for name, cfg in configs.items()
    }
    jobs[CLI] = partial(docker_run, configs["runc"].image)
    names = list(jobs)
    first = rotation % len(names)
    timed = {name: jobs[name]() for name in names[first:] + names[:first]}
    return timed, timed.pop(CLI)


def run(progress: Any) -> dict[str, Any]:
    if shutil.which("docker") is None:
        raise RuntimeError("the docker CLI is needed for the baseline: apt-get install docker.io")
    task = progress.add_task("sandbox: image", total=(len(RUNTIMES) + 1) * RUNS)
    client = docker.from_env()
    with ExitStack() as stack:
        stack.callback(client.close)
        ensure_image(client=client, progress=lambda line: progress.update(task, description=line))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gate-")))
        gate = stack.enter_context(services.sandbox_gate(folder, "--runtime", "runsc"))
        gated = docker.DockerClient(base_url=f"unix://{gate}")
        stack.callback(gated.close)
        clients = {name: gated if name == GATED else client for name in RUNTIMES}
        progress.update(task, description="sandbox: start → exec → remove on each host vs run")
        configs = {
            name: SandboxConfig(image=IMAGE_TAG, runtime=rt) for name, rt in RUNTIMES.items()
        }
        phases: dict[str, dict[str, list[float]]] = {
            name: {phase: [] for phase in PHASES} for name in RUNTIMES
        }
        cli: list[float] = []
        for i in range(WARMUP + RUNS):
            uses, seconds = one_round(clients, configs, rotation=i)
            if i < WARMUP:
                continue
            for name, use in uses.items():
                for phase, value in use.items():
                    phases[name][phase].append(value)
            cli.append(seconds)
            progress.advance(task, len(RUNTIMES) + 1)
        progress.update(task, description="sandbox: acquire from the warm pool")
        warm = pool_acquires(client, configs["runc"])
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


def stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(1000 * statistics.median(values), 1),
        "p95_ms": round(1000 * record.percentile(values, 0.95), 1),
        "n": len(values),
    }


def summarize(
    phases: dict[str, dict[str, list[float]]], cli: list[float], warm: list[float]
) -> dict[str, Any]:
    """runc's figures keep their keys (`sandbox`, `phases`); every runtime's are under
    `runtimes`."""
    runtimes: dict[str, Any] = {
        name: {
            "sandbox": stats(times["total"]),
            "phases": {phase: stats(times[phase]) for phase in PHASES[1:]},
        }
        for name, times in phases.items()
    }
    figures: dict[str, Any] = {
        **runtimes["runc"],
        "docker_run": stats(cli),
        "runtimes": runtimes,
    }
    for q in ("p50", "p95"):
        ratio = figures["sandbox"][f"{q}_ms"] / figures["docker_run"][f"{q}_ms"]
        figures[f"ratio_{q}"] = round(ratio, 2)
        gvisor = runtimes["runsc"]["sandbox"][f"{q}_ms"] / figures["sandbox"][f"{q}_ms"]
        figures[f"runsc_over_runc_{q}"] = round(gvisor, 2)
        gate = runtimes[GATED]["sandbox"][f"{q}_ms"] / runtimes["runsc"]["sandbox"][f"{q}_ms"]
        figures[f"gate_over_runsc_{q}"] = round(gate, 2)
    figures["warm_acquire"] = stats(warm)
    warm_p50 = figures["warm_acquire"]["p50_ms"]
    figures["targets"] = {
        "warm_acquire_p50_ms": {"target": f"<= {MAX_WARM_MS}", "value": warm_p50,
                                "met": warm_p50 <= MAX_WARM_MS},
    }  # fmt: skip
    return figures


HISTORY = [
    "sandbox p50 (ms)", "sandbox p95 (ms)", "docker run p50 (ms)", "docker run p95 (ms)",
    "ratio p50", "ratio p95", "warm pool acquire p50 (ms)", "cold start p50 (ms)",
    "runsc sandbox p50 (ms)", "runsc sandbox p95 (ms)", "runsc cold start p50 (ms)",
    "gate + runsc sandbox p50 (ms)", "gate + runsc sandbox p95 (ms)",
    "gate + runsc cold start p50 (ms)",
]  # fmt: skip
"""The history table's columns after the date and commit (`row`); what a run did not measure
yet (the warm pool, runsc, the gate) shows `—`."""


def row(source: Source) -> list[str]:
    """One recorded run in the history table."""
    s, d, runtimes = source["sandbox"], source["docker_run"], source.get("runtimes", {})
    warm = source.get("warm_acquire")

    def host(name: str) -> list[str]:
        if name not in runtimes:
            return ["—"] * 3
        fig = runtimes[name]
        return [_ms(fig["sandbox"]["p50_ms"]), _ms(fig["sandbox"]["p95_ms"]),
                _ms(fig["phases"]["start"]["p50_ms"])]  # fmt: skip

    return [
        _ms(s["p50_ms"]), _ms(s["p95_ms"]), _ms(d["p50_ms"]), _ms(d["p95_ms"]),
        f"{source['ratio_p50']:.2f}×", f"{source['ratio_p95']:.2f}×",
        _ms(warm["p50_ms"]) if warm else "—",
        _ms(source["phases"]["start"]["p50_ms"]) if warm else "—",
        *host("runsc"), *host(GATED),
    ]  # fmt: skip


def latest(source: Source) -> str:
    """The latest run: each host's whole use and its phases, `docker run`, the warm pool."""
    d, w = source["docker_run"], source["warm_acquire"]
    rows = []
    for name, fig in source["runtimes"].items():
        s, phases = fig["sandbox"], fig["phases"]
        rows += [
            [f"DockerSandbox ({name}): start → exec(true) → removal", str(s["n"]),
             _ms(s["p50_ms"]), _ms(s["p95_ms"])],
            *([f"… of which {label}", str(phases[phase]["n"]), _ms(phases[phase]["p50_ms"]),
               _ms(phases[phase]["p95_ms"])]
              for phase, label in (("start", "start (create + start)"), ("exec", "exec(true)"),
                                   ("remove", "removal"))),
        ]  # fmt: skip
    rows += [
        ["docker run --rm IMAGE true (CLI, runc)", str(d["n"]), _ms(d["p50_ms"]), _ms(d["p95_ms"])],
        ["warm pool (runc): ask → holding a sandbox", str(w["n"]), _ms(w["p50_ms"]),
         _ms(w["p95_ms"])],
    ]  # fmt: skip
    ratios = (
        f"The sandbox against `docker run`: {source['ratio_p50']:.2f}× at p50, "
        f"{source['ratio_p95']:.2f}× at p95; runsc against runc: "
        f"{source['runsc_over_runc_p50']:.2f}× and {source['runsc_over_runc_p95']:.2f}×; the "
        f"gate + runsc against runsc alone: {source['gate_over_runsc_p50']:.2f}× and "
        f"{source['gate_over_runsc_p95']:.2f}×."
    )
    return (
        f"{latest_run(source)}:\n\n{table(['', 'runs', 'p50 (ms)', 'p95 (ms)'], rows)}"
        f"\n\n{ratios}\n\n{targets_table(source['targets'])}"
    )


def hosts(source: Source) -> str:
    """Each sandbox host's whole use, for the docs' comparison of hosts."""
    d = source["docker_run"]
    rows = [
        [f"**{name}**", _ms(fig["sandbox"]["p50_ms"]), _ms(fig["sandbox"]["p95_ms"]),
         _ms(fig["phases"]["start"]["p50_ms"])]
        for name, fig in source["runtimes"].items()
    ] + [["a bare `docker run --rm` (runc, no hardening)", _ms(d["p50_ms"]), _ms(d["p95_ms"]),
          "—"]]  # fmt: skip
    return (
        f"Measured ({source.stamp}; `python -m bench sandbox`, {d['n']} interleaved uses of "
        f'each): a whole use — create + start, `exec(["true"])`, removal.\n\n'
        + table(["host", "whole use p50 (ms)", "p95 (ms)", "start p50 (ms)"], rows)
    )


def warm(source: Source) -> str:
    """What taking a sandbox from the warm pool costs, against starting one."""
    w, start = source["warm_acquire"], source["phases"]["start"]
    return (
        f"Measured ({source.stamp}; `python -m bench sandbox`): a sandbox from the warm pool "
        f"was in hand in {_ms(w['p50_ms'])} ms at p50 ({_ms(w['p95_ms'])} ms at p95, "
        f"{w['n']} takes), against "
        f"{_ms(start['p50_ms'])} ms at p50 to create and start one."
    )


SECTIONS = {"latest": latest, "hosts": hosts, "warm": warm}


def _ms(value: float) -> str:
    return f"{value:.0f}"

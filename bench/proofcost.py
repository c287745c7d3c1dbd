"""What the proof's line tracer costs a run of the reproducing tests (`python -m bench proofcost`).

A proof runs the reproducing tests under a line tracer (`workers.trace`) twice: on the unchanged
code, so that it can refuse a change none of whose lines the failing tests ran, and with the
change, to say which errors the code still lets out to the tests. This benchmark times
that run with and without the tracer, through the proof's own code (`workers.proof.
reproducing_run`: untraced, the command alone; traced, the tracer written into the workspace,
the command under it, and the record read back), on real bugs of the evaluation corpus:

- each instance of `INSTANCES` is materialized (its base: the published source with the bug
  put back), its environment built and validated as the harness builds it (`Environments`, with
  a private redis-server), and its hidden tests (`test.patch`) stand in for a reproducing test;
- its FAIL_TO_PASS command (`evaluation.policies.command_for`, the oracle's reproducing
  command) runs in a fresh sandbox of that environment with `test.patch` applied, as a proof's
  run without the change's code does: the first command in a clean workspace;
- untraced and traced alternate, in pairs whose order flips from one pair to the next;
  `WARMUP_PAIRS` first pairs are recorded but left out of the figures, then `PAIRS` count.
  Only the call is timed, not the sandbox around it.

Per instance: the median untraced and traced seconds, and the median of each pair's extra
seconds (traced − untraced) and ratio (traced / untraced); overall, the same medians over the
pairs of every instance. An instance's figures are void (and left out of the overall ones)
unless every traced run recorded lines that show a test file ran and that include a line the
instance's own fix (`gold.patch`) touches, and both runs of every pair failed the same tests.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from rich.markup import escape

from bench import record
from bench.docs import Source, latest_run, table
from bench.record import SHARED
from evaluation.cli import DOWNLOADS
from evaluation.corpus import Instance, load_corpus, materialize
from evaluation.policies import command_for
from orchestrator.core.store import connect
from sandbox.environment import from_table
from testkit import services
from workers import trace
from workers.environments import Environments
from workers.mirrors import RepoCache
from workers.proof import reproducing_run, split_diff
from workers.sandboxes import DockerSandboxes, Sandboxes, WorkspaceRequest
from workers.settings import WorkerSettings

CODE: tuple[str, ...] = (
    "bench/proofcost.py",
    "orchestrator/",
    "workers/",
    "sandbox/",
    "images/",
    "testkit/",
    "evaluation/",
    "eval/corpus/",
    *SHARED,
)
"""The code whose change would change this benchmark's figures (`bench.stale`)."""

COMMAND = "python -m bench proofcost"
INSTANCES = (
    "toolz-1.2.0-interpose-empty",
    "parse-1.20.2-hyphen-field-name",
    "semver-3.0.4-compare-subclass",
    "pathspec-0.12.1-match-file-none",
    "boltons-26.2.0-indexedset-update",
)
"""Quick suites: two whose pytest configuration runs pytest-cov (parse, semver), where the
profile hook stands in for the line tracer, and three where the line tracer records."""
CORPUS_ROOT = record.ROOT / "eval" / "corpus"
PAIRS = 3
WARMUP_PAIRS = 1
RUN_TIMEOUT_S = 600.0
LABELS = {"baton.bench": "proofcost"}
LINES, FUNCTIONS = "lines", "functions called"
"""What the proof read from a traced run's record: the lines the line tracer recorded, or
(a coverage tool having taken its place) every line of the functions the profile hook saw."""


@dataclass(frozen=True)
class Timed:
    """One timed run of the reproducing command."""

    seconds: float
    failed: list[str]
    timed_out: bool
    ran: dict[str, set[int]] | None
    """The lines the proof read from the tracer's record (traced runs only)."""
    record: str = ""
    """The tracer's record as the run left it (traced runs only)."""
    root: str = ""
    """The workspace's root, under which the record names files."""


def run(progress: Any) -> dict[str, Any]:
    instances = load_corpus(CORPUS_ROOT, INSTANCES)
    steps = 1 + WARMUP_PAIRS + PAIRS
    task = progress.add_task("proofcost", total=len(instances) * steps)
    worker = WorkerSettings()
    config = worker.sandbox_config()
    client = docker.from_env()
    try:
        info = client.info()
    finally:
        client.close()
    rows = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-bench-")))
        redis = connect(stack.enter_context(services.redis_server(work / "redis")))
        stack.callback(redis.close)
        mirrors = RepoCache(work / "mirrors")
        environments = Environments(redis, mirrors, worker.build_settings(), sandbox_config=config)
        sandboxes = DockerSandboxes(mirrors, config)
        for instance in instances:
            rows.append(_row(instance, environments, sandboxes, work, progress, task, steps))
    return {
        "command": COMMAND,
        "environment": {
            "runtime": config.runtime or info.get("DefaultRuntime", "unknown"),
            "runtime_is_dockerd_default": config.runtime is None,
            "docker": info.get("ServerVersion", "unknown"),
            "host_cpus": os.cpu_count(),
            "host": platform.platform(),
            "sandbox_image": config.image,
        },
        "pairs": PAIRS,
        "warmup_pairs": WARMUP_PAIRS,
        "instances": rows,
        "overall": overall(rows),
    }


def _row(
    instance: Instance,
    environments: Environments,
    sandboxes: DockerSandboxes,
    work: Path,
    progress: Any,
    task: Any,
    steps: int,
) -> dict[str, Any]:
    """`_instance`, its progress shown on `task` (`steps` of it, however it ends)."""
    done = 0

    def say(what: str) -> None:
        progress.update(task, description=escape(f"proofcost: {instance.id}: {what}"))

    def advance() -> None:
        nonlocal done
        done += 1
        progress.advance(task)

    try:
        return _instance(instance, environments, sandboxes, work, say, advance)
    except Exception as exc:  # one instance's surprise is its row, not the end of the run
        return {"instance": instance.id, "void": [f"it did not run: {exc!r}"[:600]]}
    finally:
        progress.advance(task, steps - done)


def _instance(
    instance: Instance,
    environments: Environments,
    sandboxes: DockerSandboxes,
    work: Path,
    say: Callable[[str], None],
    advance: Callable[[], None],
) -> dict[str, Any]:
    """One instance's pairs of runs, its figures, and why they are void if they are."""
    say("its base, and its environment (built if need be)")
    checkout = materialize(instance, work / "repos", record.ROOT / DOWNLOADS)
    spec = from_table(instance.environment, origin=f"{instance.id}'s instance.toml")
    started = time.monotonic()
    env = environments.prepare(str(checkout.remote), checkout.commit, spec=spec,
                               progress=lambda line: say(line[-80:]))  # fmt: skip
    environment_s = time.monotonic() - started
    advance()
    request = WorkspaceRequest(repo=str(checkout.remote), commit=checkout.commit,
                               stage="proofcost", labels=LABELS, environment=env)  # fmt: skip
    tests = instance.text("test.patch")
    command = command_for(instance, list(instance.tests.fail_to_pass))
    fix = split_diff(instance.text("gold.patch"))
    pairs, checks = [], []
    for number in range(WARMUP_PAIRS + PAIRS):
        order = (False, True) if number % 2 == 0 else (True, False)
        timed: dict[bool, Timed] = {}
        for traced in order:
            kind = "traced" if traced else "untraced"
            say(f"pair {number + 1} of {WARMUP_PAIRS + PAIRS}, {kind}")
            timed[traced] = timed_run(sandboxes, request, tests, command, traced=traced)
        pairs.append({
            "warmup": number < WARMUP_PAIRS,
            "first": "traced" if order[0] else "untraced",
            "untraced_s": round(timed[False].seconds, 3),
            "traced_s": round(timed[True].seconds, 3),
        })  # fmt: skip
        checks.append(timed)
        advance()
    traced_runs = [pair[True] for pair in checks]
    last = traced_runs[-1]
    return {
        "instance": instance.id,
        "command": command,
        "environment_built": env.built,
        "environment_s": round(environment_s, 1),
        "fail_to_pass": len(instance.tests.fail_to_pass),
        "failed": len(checks[-1][False].failed),
        "tracer": tracer_kind(last.record, last.root, list(split_diff(tests))),
        **traced_counts(last.ran or {}),
        "pairs": pairs,
        **summary(pairs),
        "void": void(checks, fix, instance.tests.fail_to_pass),
    }


def timed_run(
    sandboxes: Sandboxes, request: WorkspaceRequest, tests: str, command: str, *,
    traced: bool,
) -> Timed:  # fmt: skip
    """The reproducing command run once in a fresh sandbox with the tests applied, timed."""
    with sandboxes.open(request) as workspace:
        workspace.apply_patch(tests)
        names = list(split_diff(tests))
        started = time.perf_counter()
        repro, ran = reproducing_run(workspace, command, timeout_s=RUN_TIMEOUT_S, traced=traced,
                                     tests=names)  # fmt: skip
        seconds = time.perf_counter() - started
        kept = traced and workspace.exists(trace.RECORD)
        written = workspace.read_text(trace.RECORD) if kept else ""
    return Timed(seconds, sorted(repro.outcomes.failed), repro.result.timed_out, ran, written,
                 workspace.root)  # fmt: skip


def traced_counts(ran: Mapping[str, set[int]]) -> dict[str, int]:
    """How much a traced run's record held: the files of the workspace and their lines, and
    apart the names that are no file (`<attrs generated __eq__ …>`, `<string>`: code compiled
    from a string, whose name the tracer resolves under the workspace's root)."""
    files = [name for name in ran if not name.startswith("<")]
    return {
        "files_traced": len(files),
        "lines_traced": sum(len(ran[name]) for name in files),
        "not_files_traced": len(ran) - len(files),
    }


def tracer_kind(record: str, root: str, tests: Sequence[str]) -> str:
    """Which part of a traced run's `record` shows the `tests` ran: the lines the line tracer
    recorded (`LINES`), else the functions the profile hook saw (`FUNCTIONS`); "" if neither."""
    lines = "".join(f"{row}\n" for row in record.splitlines() if row.startswith("L\t"))
    if trace.executed(lines, root, tests) is not None:
        return LINES
    return FUNCTIONS if trace.executed(record, root, tests) is not None else ""


def void(
    checks: Sequence[Mapping[bool, Timed]], fix: Mapping[str, str], fail_to_pass: Iterable[str]
) -> list[str]:
    """Why an instance's figures do not measure the tracer at work (none: they do): a traced
    run that recorded nothing the proof reads, or nothing of what the fix (`fix`: its diff by
    file) touches; a pair whose runs failed other tests, or not the FAIL_TO_PASS ones; a run
    that timed out."""
    reasons = []
    for number, pair in enumerate(checks, 1):
        untraced, traced = pair[False], pair[True]
        if traced.ran is None:
            reasons.append(f"pair {number}: the traced run left no record the proof reads")
        elif not any(trace.touched_lines(s) & traced.ran.get(p, set()) for p, s in fix.items()):
            reasons.append(f"pair {number}: the traced run ran no line the fix touches")
        if untraced.timed_out or traced.timed_out:
            reasons.append(f"pair {number}: a run timed out")
        if untraced.failed != traced.failed:
            reasons.append(f"pair {number}: the runs failed different tests")
        if not set(fail_to_pass) <= set(untraced.failed):
            reasons.append(f"pair {number}: the FAIL_TO_PASS tests did not all fail")
    return reasons


def summary(pairs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The medians of the pairs that are not warm-ups: untraced and traced seconds, and each
    pair's extra seconds (traced − untraced) and ratio (traced / untraced)."""
    counted = [p for p in pairs if not p["warmup"]]
    if not counted:
        return {}

    def median(values: Iterable[float]) -> float:
        return round(statistics.median(values), 3) + 0.0  # a -0.0 is shown as 0.0

    return {
        "untraced_s": median(p["untraced_s"] for p in counted),
        "traced_s": median(p["traced_s"] for p in counted),
        "extra_s": median(p["traced_s"] - p["untraced_s"] for p in counted),
        "ratio": median(p["traced_s"] / p["untraced_s"] for p in counted),
    }


def overall(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`summary` over the counted pairs of every instance whose figures are not void."""
    counted = [r for r in rows if not r["void"]]
    pairs = [p for r in counted for p in r["pairs"] if not p["warmup"]]
    return {"instances": len(counted), "pairs": len(pairs), **summary(pairs)}


# -- the docs ----------------------------------------------------------------------------------

HEADER = ["instance", "what the proof read", "untraced s", "traced s", "extra s", "ratio"]


def latest(source: Source) -> str:
    """Per instance and over all, the medians of the latest run, and where they come from."""
    env = source["environment"]
    runtime = env["runtime"] + (" (dockerd's default)" if env["runtime_is_dockerd_default"] else "")
    setup = (f"sandboxes under {runtime}; per instance {source['warmup_pairs']} warm-up pair "
             f"left out, then {source['pairs']} pairs")  # fmt: skip
    rows = []
    for row in source["instances"]:
        if row["void"]:
            why = "; ".join(row["void"])[:300].replace("|", "/")
            rows.append([f"`{row['instance']}`", f"void: {why}", "", "", "", ""])
            continue
        read = f"{row['tracer']}: {row['lines_traced']} lines of {row['files_traced']} files"
        if row.get("not_files_traced"):  # code compiled from a string, taken for the workspace's
            read += f" (and {row['not_files_traced']} names that are no file)"
        rows.append([f"`{row['instance']}`", read, *_figures(source, row)])
    every = source["overall"]
    if every["pairs"]:
        label = f"**all: {every['pairs']} pairs of {every['instances']} instances**"
        rows.append([label, "", *_figures(source, every)])
    return f"{latest_run(source, setup)}:\n\n{table(HEADER, rows)}\n"


def _figures(source: Source, figures: Mapping[str, Any]) -> list[str]:
    source.derive(abs(figures["extra_s"]))  # shown signed: its digits are the magnitude's
    return [f"{figures['untraced_s']:.2f}", f"{figures['traced_s']:.2f}",
            f"{figures['extra_s']:+.2f}", f"{figures['ratio']:.2f}×"]  # fmt: skip


SECTIONS = {"latest": latest}

"""`baton demo`: the whole fixer pipeline (or `fixer-plus`, the fixer as a graph) on embedded
defaults, started and stopped here.

It starts a private redis-server unless `BATON_REDIS_URL` is set, the fake Gemini server
playing the bundled scenario (Gemini itself only when asked: the scenario is what makes the run
come out the same every time, and a key left in the environment must not spend quota), and one
worker for all stages (with a process per fix branch, for `fixer-plus`); enqueues the bundled
Sentry event against a copy of the bundled sample repository; shows progress; approves a gate
the run parks on, saying so, as a person would with `baton approve`; and stops everything it
started.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from demo import SAMPLE_REPO, SCENARIO, SENTRY_EVENT, plus
from orchestrator.control import api
from orchestrator.control.report import follow, outcome, published, run_json, run_table
from orchestrator.core import gates
from orchestrator.core.errors import ConfigError
from orchestrator.core.git import COMMITTER, git_output
from orchestrator.core.models import RunRecord, RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import FAKE_API_KEY, GEMINI_API_URL, Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.services import worker_env

PIPELINE = "fixer"


@dataclass(frozen=True)
class Demo:
    """What one demo pipeline needs: the scenario the fake server plays for it, and how many
    worker processes (one per branch that runs at once)."""

    scenario: Callable[[], dict[str, Any]]
    processes: int = 1


DEMOS = {
    "fixer": Demo(lambda: json.loads(SCENARIO.read_text())),
    "fixer-plus": Demo(plus.scenario, processes=3),
}


@dataclass
class DemoResult:
    summary: dict[str, Any]
    table: Table
    extra: RenderableType | None = None


def make_sample_repo(dest: Path) -> Path:
    """A bare repository (the "remote") holding the sample package, one commit deep."""
    work = dest.with_name(dest.name + "-work")
    shutil.copytree(SAMPLE_REPO, work, ignore=shutil.ignore_patterns("__pycache__"))
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "-m", "shopcart: carts, items and the checkout summary"],
    ):
        git_output(str(work), ["-C", str(work), *args], config=COMMITTER)
    git_output(str(work), ["clone", "-q", "--bare", str(work), str(dest)])
    shutil.rmtree(work)
    return dest


def demo_summary(run: RunRecord, outputs: dict[str, Any]) -> dict[str, Any]:
    """The `baton demo --json` object: run id, status, per-stage figures, and what the fix
    stage measured (`tests_before`, `tests_after`, `proof`) and the pr stage published
    (`branch`), as `baton status --json` has them (`outcome`; a stage that left no output has
    none)."""
    full = run_json(run)
    keep = ("status", "attempts", "requests", "prompt_tokens_total", "prompt_tokens_max",
            "output_chars", "duration_s")  # fmt: skip
    stages = {name: {k: stage[k] for k in keep} for name, stage in full["stages"].items()}
    for name, found in outcome(run, outputs, load_pipeline(run.pipeline)).items():
        stages[name].update(found)
    return {"run_id": run.id, "status": run.status.value, "reason": run.reason, "stages": stages}


def demo_settings(
    settings: Settings, stack: ExitStack, work: Path, console: Console, scenario: Path | None
) -> Settings:
    """`settings` for a demo working in `work`: a repository cache of its own, a private
    redis-server unless `BATON_REDIS_URL` names one, and with `scenario` the fake Gemini server
    playing it (recorded in `work`); what it starts stops with `stack`."""
    overrides: dict[str, Any] = {"repo_cache_dir": work / "repo-cache"}
    if not settings.redis_url:
        console.print("starting a private redis-server (AOF on)")
        overrides["redis_url"] = stack.enter_context(services.redis_server(work / "redis"))
    if scenario is not None:
        overrides["gemini_base_url"] = stack.enter_context(
            services.fake_gemini(scenario, record=work / "fake-gemini.jsonl")
        )
        overrides["google_api_key"] = SecretStr(FAKE_API_KEY)
    return settings.model_copy(update=overrides)


def run_demo(
    settings: Settings,
    *,
    timeout_s: float,
    console: Console,
    keep: bool = False,
    real_model: bool = False,
    pipeline: str = PIPELINE,
) -> DemoResult:
    """Run the demo of `pipeline` (one of `DEMOS`); with `keep`, its directory (the remote with
    the pushed branch, the logs, the recorded model requests) stays for a look afterwards. The
    model is the fake server playing the demo's scenario, or with `real_model` the one
    `settings` name.

    Raises:
        ConfigError: `real_model` without a `GOOGLE_API_KEY`, or a `BATON_REDIS_URL` that
            `orchestrator.core.connection` refuses.
    """
    if real_model and settings.google_api_key is None:
        raise ConfigError("--real-model needs GOOGLE_API_KEY (a Gemini API key)")
    if settings.redis_url:
        settings.redis_section()  # a URL Baton refuses stops the demo before anything starts
    demo = DEMOS[pipeline]
    with ExitStack() as stack:
        if keep:
            work = Path(tempfile.mkdtemp(prefix="baton-demo-"))
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-demo-")))
        scenario = None
        if not real_model:
            scenario = work / "scenario.json"
            scenario.write_text(json.dumps(demo.scenario()))
        settings = demo_settings(settings, stack, work, console, scenario)
        endpoint = settings.gemini_base_url or GEMINI_API_URL
        if real_model:
            model = f"{settings.model} at {endpoint}"
        else:
            model = f"the fake Gemini server at {endpoint}, playing the demo's scenario"
        console.print(f"model: {model}")
        repo = make_sample_repo(work / "shopcart.git")
        if keep:
            console.print(f"keeping {work}: the remote is {repo}")
        queues = [stage.queue for stage in load_pipeline(pipeline).stages]
        processes = f" ({demo.processes} processes)" if demo.processes > 1 else ""
        console.print(f"starting one worker{processes} for all stages ({', '.join(queues)})")
        stack.enter_context(services.worker(
            worker_env(settings), queues, logfile=work / "worker.log",
            concurrency=demo.processes,
        ))  # fmt: skip
        run_id = api.enqueue(
            SENTRY_EVENT.read_bytes(), repo=str(repo), pipeline=pipeline, settings=settings
        )
        console.print(f"enqueued the sample Sentry event as run {run_id} ({pipeline})")
        run = _follow_approving(run_id, settings, timeout_s, console)
        store = RunStore.from_url(settings.redis_section())
        try:
            outputs = store.outputs(run_id, ["fix", "pr"])
            extra = _outcome(run, store, outputs)
        finally:
            store.redis.close()
        where = published(run, outputs, load_pipeline(pipeline))
        table = run_table(run, width=console.width, where=where)
        return DemoResult(summary=demo_summary(run, outputs), table=table, extra=extra)
    raise AssertionError("unreachable")


def _follow_approving(
    run_id: str, settings: Settings, timeout_s: float, console: Console
) -> RunRecord:
    """Follow the run to its end; each time it parks on a gate, approve the gate as the
    demo's reviewer, saying what was approved (`baton approve` does the same)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left_s = max(deadline - time.monotonic(), 0.1)
        run = follow(run_id, settings, interval_s=0.3, timeout_s=left_s, console=console,
                     transient=True)  # fmt: skip
        if run.status != RunStatus.AWAITING_APPROVAL or time.monotonic() >= deadline:
            return run
        for gate, record in gates.pending(run).items():
            console.print(f"the run waits on gate {gate} (stage {record.stage}, a {record.approve}"
                          f" to approve): the demo approves it, as `baton approve {run_id} "
                          f"--gate {gate}` would", markup=False, highlight=False)  # fmt: skip
            api.approve(run_id, gate=gate, by="demo", settings=settings)


def _outcome(run: RunRecord, store: RunStore, outputs: dict[str, Any]) -> RenderableType | None:
    """The published change: the pull request text as pushed, and the diff."""
    pr = outputs.get("pr")
    diff_ref = run.stages["fix"].artifacts.get("workspace.diff")
    if not pr or diff_ref is None:
        return None
    message = git_output(run.repo, ["-C", run.repo, "log", "-1", "--format=%B", pr["branch"]])
    title, _, body = message.partition("\n")
    heading = Text.assemble(
        (title, "bold"),
        f"\nbranch {pr['branch']} · commit {pr['commit'][:12]} · pushed to {run.repo}\n",
        body.rstrip() + "\n",
    )
    diff = Syntax(store.artifact(diff_ref).decode(), "diff", background_color="default")
    return Panel(Group(heading, diff), title="pull request", title_align="left")

"""`baton eval`: run a corpus of real bugs through a pipeline on the fleet and measure, on its own,
which ones the pipeline resolved.

Each instance's base is enqueued as a run (its issue, its environment spec); the fleet works on
up to `concurrency` at once. When a run ends, the harness takes the newest change its fix stage
made (published or not) and, in a clean sandbox of the run's environment, applies it, puts the
instance's own hidden tests in place (`test.patch`, over whatever the change did to those
files), and runs the repository's tests: the instance is *resolved* when every FAIL_TO_PASS
test passes and every PASS_TO_PASS test still does. What the pipeline claimed is reported beside
it (reproduced, proven, published) and never counts.

Without `BATON_REDIS_URL` it starts a private redis-server, and without `GOOGLE_API_KEY` the
fake Gemini server playing a scripted policy (`evaluation.policies`: oracle or saboteur); it
starts the workers itself (one process per concurrent run), and stops all it started.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from evaluation.corpus import Checkout, Instance, materialize
from evaluation.policies import Mode, kind, playable, scenario
from orchestrator.control import api
from orchestrator.core.models import Iteration, RunRecord, RunStatus, StageRecord, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import FAKE_API_KEY, Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini.harness import FakeGemini
from testkit.services import worker_env
from workers.environments import Environments, given_spec
from workers.mirrors import RepoCache
from workers.outcomes import Outcome, parse
from workers.proof import CHECKS, split_diff
from workers.sandboxes import DockerSandboxes, WorkspaceRequest
from workers.settings import WorkerSettings
from workers.tools.code import DIFF_ARTIFACT, TEST_ENV
from workers.tools.errors import ToolError

PIPELINE = "fixer"
MEASURE_TIMEOUT_S = 900.0
Say = Callable[[str], None]
EvalMode = Mode | Literal["model"]
STOPPED_AT = {"reproduce": "reproduction", "review": "review"}
"""Where a run that ended short was stopped, by the stage its reason names (`stopped`); the fix
stage's refusals are named by the proof's check (`workers.proof.CHECKS`)."""


@dataclass
class Result:
    """One instance, one mode: what the pipeline did and what the harness measured."""

    instance: str
    mode: str
    run_id: str = ""
    status: str = "not run"
    reason: str | None = None
    environment: bool = False
    """The run's environment was built and validated."""
    reproduced: bool = False
    proven: bool = False
    """The pipeline's own proof passed (its claim)."""
    published: bool = False
    resolved: bool = False
    """Measured by the harness: every FAIL_TO_PASS passes, every PASS_TO_PASS still does."""
    fail_to_pass: list[int] = field(default_factory=lambda: [0, 0])
    """[passing, total]."""
    pass_to_pass: list[int] = field(default_factory=lambda: [0, 0])
    measured: str = ""
    """What the measurement found, in a sentence."""
    stopped: str = ""
    """Where the pipeline stopped the run (`stopped`): `reproduction`, `proof: CHECK`,
    `review`, …; `not stopped` when it was published."""
    model_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    iterations: int = 0
    wall_s: float = 0.0
    stage_calls: dict[str, int] = field(default_factory=dict)
    """Per stage that ran: its model calls, every iteration and round of it counted."""
    stage_s: dict[str, float] = field(default_factory=dict)
    """Per stage that ran: seconds from its start to its end, each iteration (a looped stage)
    or its last round (one a `send_back` ran again) counted."""
    stage_tokens: dict[str, list[int]] = field(default_factory=dict)
    """Per stage that ran: [prompt tokens, output tokens], every iteration counted."""


@dataclass
class Evaluation:
    """A whole evaluation: its results and how long it took."""

    corpus: str
    results: list[Result]
    wall_s: dict[str, float] = field(default_factory=dict)
    """Per mode: from the first enqueue to the last measurement."""

    def as_json(self) -> str:
        return json.dumps(
            {"corpus": self.corpus, "wall_s": self.wall_s,
             "results": [asdict(r) for r in self.results]}, indent=1,
        )  # fmt: skip


def evaluate(
    instances: list[Instance],
    modes: list[EvalMode],
    *,
    corpus: str,
    concurrency: int,
    settings: Settings,
    say: Say,
    run_timeout_s: float = 1200.0,
    workdir: Path | None = None,
    downloads: Path,
) -> Evaluation:
    """Run every instance in every mode; the results, in the order of `modes`, then instances."""
    results: list[Result] = []
    wall: dict[str, float] = {}
    with ExitStack() as stack:
        work = workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-eval-"))
        )
        settings, fake = _services(stack, settings, modes, work, concurrency, say)
        checkouts = {}
        for number, instance in enumerate(instances, 1):
            say(f"[{number}/{len(instances)}] {instance.id}: {instance.source}")
            checkouts[instance.id] = materialize(instance, work / "repos", downloads)
        store = RunStore.from_url(settings.redis_section())
        stack.callback(store.redis.close)
        measure = _Measurer(store, work / "measure")
        for mode in modes:
            if fake is not None:
                fake.set_scenario(scenario(instances, "oracle" if mode == "model" else mode))
            started = time.monotonic()
            playing = [i for i in instances if playable(i, mode)]
            results += _run_mode(
                playing, checkouts, mode, concurrency=concurrency, settings=settings,
                store=store, measure=measure, say=say, run_timeout_s=run_timeout_s,
            )  # fmt: skip
            wall[mode] = round(time.monotonic() - started, 1)
    return Evaluation(corpus, results, wall)


def _services(
    stack: ExitStack,
    settings: Settings,
    modes: list[EvalMode],
    work: Path,
    concurrency: int,
    say: Say,
) -> tuple[Settings, FakeGemini | None]:
    overrides: dict[str, object] = {"repo_cache_dir": work / "repo-cache"}
    if settings.redis_url:
        settings.redis_section()  # a URL Baton refuses stops it before anything starts
    else:
        say("starting a private redis-server")
        overrides["redis_url"] = stack.enter_context(services.redis_server(work / "redis"))
    fake = None
    if "model" not in modes:
        say("starting the fake Gemini server with the scripted policies")
        fake = stack.enter_context(FakeGemini.start({}))
        overrides["gemini_base_url"] = fake.url
        overrides["google_api_key"] = SecretStr(FAKE_API_KEY)
    elif settings.google_api_key is None:
        raise ValueError("the model mode needs GOOGLE_API_KEY")
    settings = settings.model_copy(update=overrides)
    queues = [stage.queue for stage in load_pipeline(PIPELINE).stages]
    say(f"starting a worker with {concurrency} processes for {', '.join(queues)}")
    stack.enter_context(
        services.worker(worker_env(settings), queues, concurrency=concurrency,
                        logfile=work / "worker.log")
    )  # fmt: skip
    return settings, fake


def _run_mode(
    instances: list[Instance],
    checkouts: dict[str, Checkout],
    mode: EvalMode,
    *,
    concurrency: int,
    settings: Settings,
    store: RunStore,
    measure: _Measurer,
    say: Say,
    run_timeout_s: float,
) -> list[Result]:
    waiting = list(instances)
    running: dict[str, tuple[Instance, float]] = {}
    results: dict[str, Result] = {}
    while waiting or running:
        while waiting and len(running) < concurrency:
            instance = waiting.pop(0)
            checkout = checkouts[instance.id]
            run_id = api.enqueue(
                instance.issue, repo=str(checkout.remote), ref=checkout.commit,
                pipeline=PIPELINE, environment=instance.environment, force=True,
                settings=settings,
            )  # fmt: skip
            running[run_id] = (instance, time.monotonic())
            say(f"{mode} · {instance.id}: run {run_id} enqueued")
        time.sleep(0.5)
        for run_id, (instance, started) in list(running.items()):
            run = store.get(run_id)
            late = time.monotonic() - started > run_timeout_s
            if not run.status.is_terminal and not late:
                continue
            if late and not run.status.is_terminal:
                api.cancel(run_id, settings=settings)
                run = store.get(run_id)
            del running[run_id]
            result = figures(Result(instance.id, mode, run_id), run)
            result.wall_s = round(time.monotonic() - started, 1)
            measure(instance, run, result)
            results[instance.id] = result
            verdict = "RESOLVED" if result.resolved else "not resolved"
            said = f" — {run.reason}" if run.reason else ""
            say(f"{mode} · {instance.id}: {run.status.value} in {result.wall_s:.0f} s{said}; "
                f"{verdict} ({result.measured})")  # fmt: skip
    return [results[i.id] for i in instances]


def figures(result: Result, run: RunRecord) -> Result:
    """What the run claimed and cost, from its record."""
    result.status, result.reason = run.status.value, run.reason
    result.environment = run.environment is not None
    stages = run.stages
    result.reproduced = stages["reproduce"].status == StageStatus.DONE
    fix = stages["fix"]
    result.proven = fix.status == StageStatus.DONE
    result.published = run.status == RunStatus.DONE
    result.iterations = len(fix.iterations)
    result.stopped = stopped(result.published, run.reason)
    for name, record in stages.items():
        spent: list[StageRecord | Iteration] = [*record.iterations] or [record]
        result.model_calls += sum(i.requests for i in spent)
        result.prompt_tokens += sum(i.prompt_tokens_total for i in spent)
        result.output_tokens += sum(i.output_tokens for i in spent)
        timed = [(i.started_at, i.finished_at) for i in spent if i.started_at and i.finished_at]
        if timed:
            result.stage_calls[name] = sum(i.requests for i in spent)
            result.stage_s[name] = round(sum(end - start for start, end in timed), 2)
            result.stage_tokens[name] = [
                sum(i.prompt_tokens_total for i in spent),
                sum(i.output_tokens for i in spent),
            ]
    return result


def stopped(published: bool, reason: str | None) -> str:
    """Where a run was stopped, from its reason (`<stage>: why`): `not stopped` when it was
    published; `reproduction` or `review` by the stage; `proof: CHECK` for the fix stage, CHECK
    being the proof's check that refused it (`workers.proof.CHECKS`), `other` when none is."""
    if published:
        return "not stopped"
    stage, _, why = (reason or "").partition(": ")
    if stage in STOPPED_AT:
        return STOPPED_AT[stage]
    if stage == "fix":
        check = next((name for name, said in CHECKS.items() if said in why), "other")
        return f"proof: {check}"
    return stage or "not finished"


def false_publication(result: Result) -> bool:
    """A publication that should not have been: in a saboteur's mode any publication (its fix
    is wrong by construction, whatever the hidden tests say), else one not resolved."""
    return result.published and (kind(result.mode) is not None or not result.resolved)


class _Measurer:
    """Measures an ended run's change with the instance's hidden tests, in a clean sandbox."""

    def __init__(self, store: RunStore, workdir: Path) -> None:
        self.store = store
        worker = WorkerSettings()
        self.mirrors = RepoCache(workdir / "repos")
        self.environments = Environments(
            store.redis, self.mirrors, worker.build_settings(),
            sandbox_config=worker.sandbox_config(),
        )  # fmt: skip
        self.sandboxes = DockerSandboxes(self.mirrors, worker.sandbox_config())

    def __call__(self, instance: Instance, run: RunRecord, result: Result) -> None:
        ref = run.stages["fix"].artifacts.get(DIFF_ARTIFACT)
        change = self.store.artifact(ref).decode() if ref is not None else ""
        wanted = {"fail_to_pass": instance.tests.fail_to_pass,
                  "pass_to_pass": instance.tests.pass_to_pass}  # fmt: skip
        for name, ids in wanted.items():
            setattr(result, name, [0, len(ids)])
        if not change.strip():
            result.measured = "the run made no change to measure"
            return
        try:
            outcomes = self._outcomes(instance, run, change)
        except (ToolError, OSError, RuntimeError) as exc:
            result.measured = f"could not be measured: {exc}"
            return
        for name, ids in wanted.items():
            setattr(result, name, [sum(outcomes.get(i) == Outcome.PASSED for i in ids), len(ids)])
        f2p, p2p = result.fail_to_pass, result.pass_to_pass
        result.resolved = f2p[0] == f2p[1] and p2p[0] == p2p[1]
        result.measured = f"fail→pass {f2p[0]}/{f2p[1]}, pass→pass {p2p[0]}/{p2p[1]}"

    def _outcomes(self, instance: Instance, run: RunRecord, change: str) -> dict[str, Outcome]:
        env = self.environments.prepare(run.repo, run.commit, spec=given_spec(run))
        if not env.test_command:
            raise RuntimeError("the environment has no test command")
        request = WorkspaceRequest(
            repo=run.repo, commit=run.commit, stage="eval", environment=env,
            labels={"baton.run": run.id, "baton.stage": "eval", "baton.attempt": "0"},
        )  # fmt: skip
        hidden = instance.text("test.patch")
        with self.sandboxes.open(request) as workspace:
            workspace.apply_patch(change)
            for path in split_diff(hidden):  # the instance's tests, whatever the change did
                workspace.run(["sh", "-c", 'git checkout -q HEAD -- "$1" 2>/dev/null || rm -f "$1"',
                               "reset", path], timeout_s=60)  # fmt: skip
            workspace.apply_patch(hidden)
            ran = workspace.run(["sh", "-c", env.test_command], timeout_s=MEASURE_TIMEOUT_S,
                                env=TEST_ENV)  # fmt: skip
        return parse(ran.output).by_id

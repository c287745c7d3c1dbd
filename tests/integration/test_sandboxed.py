"""Code stages in Docker sandboxes, end to end: proof of the fix, publishing, secrets, leaks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from demo import SENTRY_EVENT
from orchestrator.models import RunStatus, StageStatus
from orchestrator.pipeline import load_pipeline
from orchestrator.store import RunStore
from testkit import services
from testkit.github import FakeGitHub
from testkit.services import worker_env
from testkit.sinks import MemoryArtifacts
from tests.containers import sandboxes
from tests.repos import Git
from workers.gemini import build_model, close_model
from workers.inputs import StageInputs, resolve
from workers.mirrors import RepoCache
from workers.publish import Publisher
from workers.sandboxes import DockerSandboxes
from workers.settings import WorkerSettings
from workers.stage import StageOutput, StageSinks, execute_stage

from .conftest import CANARY_KEY, Stack, demo_scenario, stack_settings

STAGES = ["triage", "search", "plan", "fix", "pr"]
ROOT = Path(__file__).resolve().parents[2]
GITHUB_CANARY = "ghp_CanaryTokenThatMustNeverLeak0000000000"


def containers(label: str) -> list[str]:
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    return listed.stdout.split()


def test_the_fix_is_proven_in_the_sandbox_and_the_branch_holds_exactly_that_change(
    stack: Stack, run_store: RunStore, git: Git
) -> None:
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.DONE, run.reason
    fix = run_store.output(run.id, "fix")
    assert fix is not None
    command = "python3 -m unittest discover -s tests -t ."
    assert fix["tests_before"] == {
        "command": command,
        "exit_code": 1,
        "passed": 2,
        "failed": 2,
        "timed_out": False,
    }
    assert fix["tests_after"] == {
        "command": command,
        "exit_code": 0,
        "passed": 4,
        "failed": 0,
        "timed_out": False,
    }
    branch = f"baton/{run.id}"
    pushed = git.raw(
        "diff", "--binary", "--src-prefix=a/", "--dst-prefix=b/", "main", branch, cwd=repo
    ).decode()
    diff = run_store.artifact(run.stages["fix"].artifacts["workspace.diff"]).decode()
    assert pushed == diff
    assert git("rev-list", "--count", f"main..{branch}", cwd=repo) == "1"
    message = git("log", "-1", "--format=%B", branch, cwd=repo)
    assert message.startswith(
        "Fix ZeroDivisionError in Cart.average_price_cents for an empty cart\n"
    )
    assert f"Verified by Baton in a sandbox with `{command}`:" in message
    assert "- before the change: exit code 1, 2 passed, 2 failed" in message
    assert "- after the change: exit code 0, 4 passed, 0 failed" in message
    assert run_store.output(run.id, "pr")["branch"] == branch  # type: ignore[index]
    assert sandboxes(run.id) == []


def test_a_repository_as_it_is_runs_to_the_end_and_names_its_environment(
    stack: Stack, run_store: RunStore, git: Git
) -> None:
    repo = stack.sample_repo()  # a bare repository: the remote
    work = repo.with_name(repo.name + "-clone")
    git("clone", "--quiet", repo, work)
    for name, target in {"shared": "..", "deep": "../../..", "etc-link": "/etc"}.items():
        (work / name).symlink_to(target)
    (work / "-rf").write_text("a file whose name looks like an option\n")
    (work / "assets").mkdir()
    (work / "assets" / "blob.bin").write_bytes(os.urandom(20 * 2**20))
    git("add", "--all", cwd=work)
    git("commit", "--quiet", "-m", "a repository as repositories are", cwd=work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=work)

    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo), timeout_s=240)

    assert run.status == RunStatus.DONE, run.reason
    assert run.environment is not None and len(run.environment) == 16
    environment = run_store.redis.hgetall(f"baton:env:{run.environment}")
    assert environment["status"] == "ok"  # validated: the unchanged code's tests ran there
    assert environment["test_command"] == "python3 -m unittest discover -s tests -t . -v"
    assert (environment["passed"], environment["failed"]) == ("2", "2")
    changed = git("diff", "--name-only", "main", f"baton/{run.id}", cwd=repo).split()
    assert changed == ["shopcart/cart.py"]
    assert sandboxes(run.id) == []


def test_a_fix_whose_tests_still_fail_is_not_published(stack: Stack, git: Git) -> None:
    scenario = demo_scenario()
    steps = scenario["agents"]["fix"]["steps"]
    steps[1]["call"]["args"]["new_text"] = "        return -1\n"  # a wrong fix
    stack.fake.set_scenario(scenario)
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.FAILED
    assert run.reason is not None
    assert run.reason.startswith("fix: the tests still fail after the change (`python3 -m unittest")
    assert "exit code 1, 2 passed, 2 failed" in run.reason
    assert run.stages["pr"].status == StageStatus.PENDING
    assert git("branch", "--list", "baton/*", cwd=repo) == ""


def _fix_that_also_adds_a_workflow() -> dict[str, Any]:
    scenario = demo_scenario()
    workflow = {"path": ".github/workflows/x.yml", "old_text": "", "new_text": "on: push\n"}
    scenario["agents"]["fix"]["steps"].insert(2, {"call": {"name": "edit_file", "args": workflow}})
    return scenario


def test_a_fix_that_also_adds_a_workflow_is_refused_with_that_reason(
    stack: Stack, git: Git
) -> None:
    stack.fake.set_scenario(_fix_that_also_adds_a_workflow())
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo))

    assert run.status == RunStatus.FAILED
    assert run.reason is not None and run.reason.startswith(f"pr: cannot publish baton/{run.id}")
    assert "refused: the change holds what this pipeline does not publish: " \
        ".github/workflows/x.yml (unplanned, ci)" in run.reason  # fmt: skip
    assert git("branch", "--list", "baton/*", cwd=repo) == ""


def test_the_same_fix_with_those_classes_allowed_is_published_and_lists_the_file(
    stack: Stack, git: Git, tmp_path: Path
) -> None:
    fixer = (ROOT / "orchestrator" / "pipelines" / "fixer.toml").read_text()
    planned_only = 'publish = { planned_from = "plan.files_to_change" }'
    assert planned_only in fixer
    allowing = tmp_path / "fixer-allowing-ci.toml"
    allowed = planned_only.replace(" }", ', allow = ["unplanned", "ci"] }')
    allowing.write_text(fixer.replace(planned_only, allowed))
    stack.fake.set_scenario(_fix_that_also_adds_a_workflow())
    repo = stack.sample_repo()
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), repo, pipeline=str(allowing)))

    assert run.status == RunStatus.DONE, run.reason
    branch = f"baton/{run.id}"
    changed = git("diff", "--name-only", "main", branch, cwd=repo).split()
    assert changed == [".github/workflows/x.yml", "shopcart/cart.py"]
    message = git("log", "-1", "--format=%B", branch, cwd=repo)
    assert message.rstrip().endswith(
        "Changed files, as Baton checked them:\n"
        "- `.github/workflows/x.yml` — added; unplanned (allowed), ci (allowed)\n"
        "- `shopcart/cart.py` — modified; planned"
    )


def test_no_secret_reaches_a_container_a_model_request_an_artifact_or_the_audit_log(
    redis_url: str, stack: Stack, tmp_path: Path
) -> None:
    settings = stack_settings(redis_url.rsplit("/", 1)[0] + "/6", stack.fake, tmp_path)
    mine = Stack(settings, stack.fake, tmp_path)
    seen: dict[str, list[str]] = {}
    done = threading.Event()

    def watch_containers() -> None:
        while not done.is_set():
            for cid in containers("baton.sandbox=1"):
                if cid not in seen:
                    inspected = subprocess.run(
                        ["docker", "inspect", cid], capture_output=True, text=True
                    )
                    if inspected.returncode == 0:
                        seen[cid] = json.loads(inspected.stdout)[0]["Config"]["Env"]
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_containers, daemon=True)
    env = {"BATON_GITHUB_TOKEN": GITHUB_CANARY}
    with services.worker({**worker_env(settings), **env}, [f"baton.{s}" for s in STAGES],
                         logfile=tmp_path / "worker.log"):  # fmt: skip
        watcher.start()
        run = mine.wait(mine.enqueue(SENTRY_EVENT.read_bytes(), mine.sample_repo()))
        done.set()
        watcher.join()
    store = RunStore.from_url(settings.require_redis_url())
    artifacts = [store.artifact(ref) for r in run.stages.values() for ref in r.artifacts.values()]
    audit = json.dumps(store.audit_log(run.id))
    store.redis.close()

    assert run.status == RunStatus.DONE, run.reason
    assert len(seen) >= 3, "the search, fix and pr sandboxes were not all seen"
    for secret in (CANARY_KEY, GITHUB_CANARY):
        assert all(secret not in "\n".join(env) for env in seen.values())
        assert secret not in json.dumps(stack.requests())
        assert all(secret.encode() not in data for data in artifacts)
        assert secret not in audit
        assert secret not in (tmp_path / "worker.log").read_text()


def test_a_worker_killed_mid_stage_leaves_no_container_once_the_reaper_ran(
    redis_url: str, stack: Stack, tmp_path: Path
) -> None:
    settings = stack_settings(redis_url.rsplit("/", 1)[0] + "/7", stack.fake, tmp_path)
    mine = Stack(settings, stack.fake, tmp_path)
    stack.fake.set_faults([{"agent": "fix", "latency_ms": 30_000}])
    queues = [f"baton.{s}" for s in STAGES]
    with services.worker(worker_env(settings), queues, logfile=tmp_path / "first.log") as first:
        run_id = mine.enqueue(SENTRY_EVENT.read_bytes(), mine.sample_repo())
        deadline = time.monotonic() + 60
        while not sandboxes(run_id):
            assert time.monotonic() < deadline, "the fix stage never started its sandbox"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        left = sandboxes(run_id)
        stack.fake.set_faults([])
        with services.worker(worker_env(settings), ["baton.none"], logfile=tmp_path / "second.log"):
            remaining = sandboxes(run_id)

    assert left, "the killed worker's sandbox should outlive it until the reaper runs"
    assert remaining == []


def test_running_the_pr_stage_twice_yields_one_branch_and_one_pull_request(
    stack: Stack, run_store: RunStore, tmp_path: Path, monkeypatch: Any, git: Git
) -> None:
    remote = "https://github.com/octo/widgets.git"
    bare = stack.sample_repo()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[url "{bare}"]\n\tinsteadOf = {remote}\n')
    monkeypatch.setenv("HOME", str(home))
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), bare))
    assert run.status == RunStatus.DONE, run.reason
    pipeline_run = run.model_copy(update={"repo": remote})
    settings = WorkerSettings(**stack.settings.model_dump(exclude={"google_api_key"}),
                              google_api_key=stack.settings.google_api_key)  # fmt: skip

    with FakeGitHub.start(token="gh-token", default_branch="main") as github:
        repos = RepoCache(tmp_path / "cache")
        sandboxes = DockerSandboxes(repos, settings.sandbox_config())
        publisher = Publisher(repos, token=SecretStr("gh-token"), github_api_url=github.url)
        pipeline = load_pipeline("fixer")
        results = []
        for attempt in (2, 3):
            inputs = resolve(pipeline_run, pipeline, pipeline.stage("pr"), attempt, run_store)
            sinks = StageSinks(artifacts=MemoryArtifacts(run.id), audit=lambda entries: None)
            results.append(asyncio.run(_run_stage(inputs, sinks, sandboxes, publisher, settings)))

    assert results[0].output["branch"] == results[1].output["branch"] == f"baton/{run.id}"
    assert results[0].output["commit"] == results[1].output["commit"]
    assert git("for-each-ref", "--format=%(refname)", "refs/heads/baton/", cwd=bare).split() == [
        f"refs/heads/baton/{run.id}"
    ]
    assert len(github.posts()) == 1
    assert len(github.pulls) == 1


async def _run_stage(
    inputs: StageInputs,
    sinks: StageSinks,
    sandboxes: DockerSandboxes,
    publisher: Publisher,
    settings: WorkerSettings,
) -> StageOutput:
    model = build_model(settings.model_section(), settings.retry)
    try:
        return await execute_stage(
            inputs, model=model, sinks=sinks, sandboxes=sandboxes, publisher=publisher
        )
    finally:
        await close_model(model)


def test_a_docker_daemon_failure_is_retried_then_fails_the_run_with_the_reason(
    redis_url: str, stack: Stack, tmp_path: Path
) -> None:
    settings = stack_settings(redis_url.rsplit("/", 1)[0] + "/8", stack.fake, tmp_path)
    mine = Stack(settings, stack.fake, tmp_path)
    broken = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    queues = [f"baton.{s}" for s in STAGES]
    with services.worker({**worker_env(settings), **broken}, queues, logfile=tmp_path / "w.log"):
        run = mine.wait(mine.enqueue(SENTRY_EVENT.read_bytes(), mine.sample_repo()), timeout_s=120)

    search = run.stages["search"]
    assert run.status == RunStatus.FAILED
    assert run.reason is not None and run.reason.startswith("search: the sandbox failed: ")
    assert run.reason.endswith("(after 3 attempts)")
    assert (search.attempts, search.rate_limit_retries, search.infrastructure_retries) == (3, 0, 2)
    assert run.stages["triage"].status == StageStatus.DONE

"""A code stage's workspace: a real sandbox holding the pinned commit and the upstream changes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from orchestrator.models import Issue, IssueSource, RunRecord, StageRecord
from orchestrator.pipeline import load_pipeline
from orchestrator.store import RunStore
from sandbox import SandboxConfig
from workers.mirrors import RepoCache
from workers.sandboxes import StageJob, open_workspace
from workers.tools.code import DIFF_ARTIFACT
from workers.tools.errors import ToolError

IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "app.py").write_text("def total(xs):\n    return sum(xs)\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, *IDENTITY, "commit", "-qm", "one")
    (path / "app.py").write_text("def total(xs):\n    return sum(xs) + 1\n")
    git(path, *IDENTITY, "commit", "-qam", "two (not the pinned one)")
    return path


def job_for(
    repo: Path, stage: str, *, fix_diff: object = None, network: str | None = None
) -> StageJob:
    pipeline = load_pipeline("fixer")
    spec = pipeline.stage(stage)
    if network:
        spec = spec.model_copy(update={"sandbox_network": network})
    stages = {s.name: StageRecord() for s in pipeline.stages}
    if fix_diff is not None:
        stages["fix"] = StageRecord(artifacts={DIFF_ARTIFACT: fix_diff})
    pinned = git(repo, "rev-parse", "HEAD~1").strip()
    issue = Issue(source=IssueSource.TEXT, title="t")
    run = RunRecord(
        id="run-ws", pipeline="fixer", repo=str(repo), commit=pinned, issue=issue,
        idempotency_key="k", stages=stages,
    )  # fmt: skip
    return StageJob(run, pipeline, spec, attempt=1)


@pytest.fixture
def network() -> Iterator[str]:
    client = docker.from_env()
    made = client.networks.create("baton-test-egress", internal=True)
    yield made.name
    made.remove()
    client.close()


def test_the_workspace_holds_the_pinned_commit_and_is_writable(
    repo: Path, store: RunStore, tmp_path: Path
) -> None:
    job = job_for(repo, "search")
    with open_workspace(
        job, store=store, repos=RepoCache(tmp_path / "cache"), config=SandboxConfig()
    ) as ws:
        labels = docker.from_env().containers.get(ws.box.id).labels
        assert ws.read_text("app.py") == "def total(xs):\n    return sum(xs)\n"
        assert ws.diff() == ""
        ws.write_text("app.py", "changed\n")
        assert "+changed" in ws.diff()
        box_id = ws.box.id
    assert (labels["baton.run"], labels["baton.stage"], labels["baton.attempt"]) == (
        "run-ws",
        "search",
        "1",
    )
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(box_id)


def test_the_changes_of_an_earlier_stage_are_applied(
    repo: Path, store: RunStore, tmp_path: Path
) -> None:
    diff = (
        "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n"
        " def total(xs):\n-    return sum(xs)\n+    return sum(xs or [])\n"
    )
    ref = store.put_artifact("run-ws", "fix/workspace.diff", diff.encode(), "text/x-diff")
    job = job_for(repo, "pr", fix_diff=ref)
    with open_workspace(
        job, store=store, repos=RepoCache(tmp_path / "cache"), config=SandboxConfig()
    ) as ws:
        assert ws.read_text("app.py") == "def total(xs):\n    return sum(xs or [])\n"


def test_a_sandbox_has_no_network_unless_its_stage_names_one(
    repo: Path, store: RunStore, tmp_path: Path, network: str
) -> None:
    client = docker.from_env()
    repos = RepoCache(tmp_path / "cache")
    with open_workspace(
        job_for(repo, "search"), store=store, repos=repos, config=SandboxConfig()
    ) as ws:
        default = client.containers.get(ws.box.id).attrs["HostConfig"]["NetworkMode"]
    job = job_for(repo, "search", network=network)
    with open_workspace(job, store=store, repos=repos, config=SandboxConfig()) as ws:
        joined = client.containers.get(ws.box.id).attrs["HostConfig"]["NetworkMode"]
    client.close()
    assert (default, joined) == ("none", network)


def test_list_files_in_a_sandbox_leaves_out_deleted_files_and_keeps_new_ones(
    repo: Path, store: RunStore, tmp_path: Path
) -> None:
    job = job_for(repo, "search")
    with open_workspace(
        job, store=store, repos=RepoCache(tmp_path / "cache"), config=SandboxConfig()
    ) as ws:
        before = ws.list_files()
        ws.write_text("lib/new.py", "x = 1\n")
        assert ws.run(["rm", "app.py"], timeout_s=10).exit_code == 0
        after = ws.list_files()

    assert before == ["app.py"]
    assert after == ["lib/new.py"]


def test_writing_a_read_only_file_in_a_sandbox_is_a_tool_error_not_a_crash(
    repo: Path, store: RunStore, tmp_path: Path
) -> None:
    job = job_for(repo, "fix")
    with open_workspace(
        job, store=store, repos=RepoCache(tmp_path / "cache"), config=SandboxConfig()
    ) as ws:
        assert ws.run(["chmod", "0444", "app.py"], timeout_s=10).exit_code == 0
        with pytest.raises(ToolError, match=r"cannot write app\.py: .*[Pp]ermission denied"):
            ws.write_text("app.py", "changed\n")
        unchanged = ws.read_text("app.py")

    assert unchanged == "def total(xs):\n    return sum(xs)\n"

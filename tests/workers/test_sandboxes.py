"""`DockerSandboxes`: a code stage's workspace in a real sandbox, holding the pinned commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandbox import SandboxConfig
from tests.repos import Git
from workers.mirrors import RepoCache
from workers.sandboxes import DockerSandboxes, WorkspaceRequest
from workers.tools.container import ContainerWorkspace
from workers.tools.errors import ToolError

pytestmark = pytest.mark.integration  # real dockerd


@pytest.fixture
def repo(tmp_path: Path, git: Git) -> Path:
    """A repository whose pinned commit (`HEAD~1`) is not its newest."""
    path = tmp_path / "repo"
    path.mkdir()
    (path / "app.py").write_text("def total(xs):\n    return sum(xs)\n")
    git("init", "-q", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "-qm", "one", cwd=path)
    (path / "app.py").write_text("def total(xs):\n    return sum(xs) + 1\n")
    git("commit", "-qam", "two (not the pinned one)", cwd=path)
    return path


def request_for(repo: Path, stage: str = "search", network: str | None = None) -> WorkspaceRequest:
    pinned = Git()("rev-parse", "HEAD~1", cwd=repo)
    labels = {"baton.run": "run-ws", "baton.stage": stage, "baton.attempt": "1"}
    return WorkspaceRequest(
        repo=str(repo), commit=pinned, stage=stage, labels=labels, network=network
    )


@pytest.fixture
def sandboxes(tmp_path: Path) -> DockerSandboxes:
    return DockerSandboxes(RepoCache(tmp_path / "cache"), SandboxConfig())


@pytest.fixture
def network() -> Iterator[str]:
    client = docker.from_env()
    made = client.networks.create("baton-test-egress", internal=True)
    yield made.name
    made.remove()
    client.close()


def test_the_workspace_holds_the_pinned_commit_and_is_writable(
    repo: Path, sandboxes: DockerSandboxes
) -> None:
    with sandboxes.open(request_for(repo)) as ws:
        assert isinstance(ws, ContainerWorkspace)
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


def test_an_earlier_stage_s_change_applies_and_is_the_diff_afterwards(
    repo: Path, sandboxes: DockerSandboxes
) -> None:
    diff = (
        "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n"
        " def total(xs):\n-    return sum(xs)\n+    return sum(xs or [])\n"
    )
    with sandboxes.open(request_for(repo, "pr")) as ws:
        ws.apply_patch(diff)
        assert ws.read_text("app.py") == "def total(xs):\n    return sum(xs or [])\n"
        assert "+    return sum(xs or [])" in ws.diff()


def test_a_sandbox_has_no_network_unless_its_stage_names_one(
    repo: Path, sandboxes: DockerSandboxes, network: str
) -> None:
    client = docker.from_env()
    with sandboxes.open(request_for(repo)) as ws:
        assert isinstance(ws, ContainerWorkspace)
        default = client.containers.get(ws.box.id).attrs["HostConfig"]["NetworkMode"]
    with sandboxes.open(request_for(repo, network=network)) as ws:
        assert isinstance(ws, ContainerWorkspace)
        joined = client.containers.get(ws.box.id).attrs["HostConfig"]["NetworkMode"]
    client.close()
    assert (default, joined) == ("none", network)


def test_list_files_in_a_sandbox_leaves_out_deleted_files_and_keeps_new_ones(
    repo: Path, sandboxes: DockerSandboxes
) -> None:
    with sandboxes.open(request_for(repo)) as ws:
        before = ws.list_files()
        ws.write_text("lib/new.py", "x = 1\n")
        assert ws.run(["rm", "app.py"], timeout_s=10).exit_code == 0
        after = ws.list_files()

    assert before == ["app.py"]
    assert after == ["lib/new.py"]


def test_writing_a_read_only_file_in_a_sandbox_is_a_tool_error_not_a_crash(
    repo: Path, sandboxes: DockerSandboxes
) -> None:
    with sandboxes.open(request_for(repo, "fix")) as ws:
        assert ws.run(["chmod", "0444", "app.py"], timeout_s=10).exit_code == 0
        with pytest.raises(ToolError, match=r"cannot write app\.py: .*[Pp]ermission denied"):
            ws.write_text("app.py", "changed\n")
        unchanged = ws.read_text("app.py")

    assert unchanged == "def total(xs):\n    return sum(xs)\n"

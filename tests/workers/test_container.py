"""The sandbox workspace's git, without Docker: a stand-in for the sandbox runs each command on
this host, in a folder, and records how it was asked to run it."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox import DockerSandbox, ExecResult
from workers.baseline import with_baseline
from workers.tools.container import ContainerWorkspace
from workers.tools.errors import ToolError
from workers.tools.workspace import TEST_BYPRODUCTS


@dataclass
class HostBox:
    """The part of `DockerSandbox` a `ContainerWorkspace` uses, on a folder of this host."""

    folder: Path
    calls: list[dict[str, Any]] = field(default_factory=list)

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self.calls.append({"argv": list(argv), "timeout_s": timeout_s, "env": dict(env or {})})
        done = subprocess.run(
            list(argv),
            cwd=self.folder,
            input=stdin or b"",
            env={"PATH": os.environ["PATH"], "HOME": str(self.folder), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        return ExecResult(
            exit_code=done.returncode,
            output=done.stdout.decode(),
            timed_out=False,
            oom_killed=False,
            truncated=False,
            duration_s=0.0,
        )

    def write_file(self, path: str, data: bytes) -> None:
        (self.folder / path).parent.mkdir(parents=True, exist_ok=True)  # as the real one does
        (self.folder / path).write_bytes(data)

    def read_file(self, path: str, *, max_bytes: int) -> bytes:
        return (self.folder / path).read_bytes()[:max_bytes]


def commit_baseline(folder: Path) -> None:
    """What `DockerSandboxes` puts beside a workspace's files: their baseline, made from an
    archive of them (`workers.baseline`)."""
    files = io.BytesIO()
    with tarfile.open(fileobj=files, mode="w") as archive:
        for path in sorted(folder.rglob("*")):
            archive.add(path, path.relative_to(folder).as_posix(), recursive=False)
    laid = with_baseline(
        files.getvalue(), ignored=TEST_BYPRODUCTS, uid=os.getuid(), gid=os.getgid()
    )
    with tarfile.open(fileobj=io.BytesIO(laid)) as archive:
        archive.extractall(
            folder, members=[m for m in archive if m.name.startswith(".git")], filter="data"
        )


def test_every_git_command_in_the_sandbox_runs_under_the_local_git_time_limit(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    box = HostBox(tmp_path)
    workspace = ContainerWorkspace(cast(DockerSandbox, box), root=str(tmp_path))

    commit_baseline(tmp_path)
    workspace.write_text("app.py", "x = 2\n")
    workspace.diff()
    workspace.list_files()

    git_calls = [call for call in box.calls if "git" in " ".join(call["argv"][:3]).split()]
    assert len(git_calls) >= 2  # the diff and the listing, one exec each
    assert {call["timeout_s"] for call in git_calls} == {120.0}


def test_what_running_the_tests_leaves_behind_is_never_part_of_the_diff(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    workspace = ContainerWorkspace(cast(DockerSandbox, HostBox(tmp_path)), root=str(tmp_path))
    commit_baseline(tmp_path)

    workspace.write_text("app.py", "x = 2\n")
    workspace.write_text("tests/test_app.py", "def test_x(): pass\n")
    for left in (
        ".coverage",
        "coverage.xml",
        "__pycache__/app.cpython-311.pyc",
        "htmlcov/index.html",
        ".hypothesis/examples/1",
        "pkg.egg-info/PKG-INFO",
    ):
        (tmp_path / left).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / left).write_bytes(b"\x00 by-product")  # fmt: skip

    changed = [ln for ln in workspace.diff().splitlines() if ln.startswith("diff --git")]
    assert changed == [
        "diff --git a/app.py b/app.py", "diff --git a/tests/test_app.py b/tests/test_app.py"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("up/secret.txt", "outside the repository"),
        ("etc/hostname", "outside the repository"),
        ("deep/secret.txt", "outside the repository"),
        ("inner-git/config", "inside .git"),
    ],
)
def test_paths_through_symlinks_out_of_the_sandbox_workspace_are_refused(
    tmp_path: Path, path: str, words: str
) -> None:
    root = tmp_path / "workspace"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (tmp_path / "secret.txt").write_text("s3cret\n")
    (root / "up").symlink_to("..")
    (root / "etc").symlink_to("/etc")
    (root / "deep").symlink_to("sub/../../")
    (root / "inner-git").symlink_to(".git")
    workspace = ContainerWorkspace(cast(DockerSandbox, HostBox(root)), root=str(root))

    for touch in (workspace.read_text, workspace.exists, lambda p: workspace.write_text(p, "x")):
        with pytest.raises(ToolError, match=words):
            touch(path)
    assert (tmp_path / "secret.txt").read_text() == "s3cret\n"


def test_a_symlink_inside_the_sandbox_workspace_is_followed(tmp_path: Path) -> None:
    (tmp_path / "cart.py").write_text("TOTAL = 1\n")
    (tmp_path / "link.py").symlink_to("cart.py")
    workspace = ContainerWorkspace(cast(DockerSandbox, HostBox(tmp_path)), root=str(tmp_path))

    assert workspace.read_text("link.py") == "TOTAL = 1\n"
    workspace.write_text("made.py", "x = 2\n")
    assert (tmp_path / "made.py").read_text() == "x = 2\n"
    assert not workspace.exists("missing.py")


@dataclass
class StalledBox(HostBox):
    """A sandbox whose path lookups do not finish: killed at their time limit, or by a signal."""

    timed_out: bool = True

    def exec(self, argv: Sequence[str], **kwargs: Any) -> ExecResult:
        if argv[0] != "sh" or "realpath" not in argv[2]:
            return super().exec(argv, **kwargs)
        return ExecResult(exit_code=None if self.timed_out else -9, output="",
                          timed_out=self.timed_out, oom_killed=False, truncated=False,
                          duration_s=0.0)  # fmt: skip


@pytest.mark.parametrize("timed_out", [True, False], ids=["timed out", "killed"])
def test_a_path_lookup_the_sandbox_did_not_answer_is_a_tool_error_not_a_missing_file(
    tmp_path: Path, timed_out: bool
) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    box = StalledBox(tmp_path, timed_out=timed_out)
    workspace = ContainerWorkspace(cast(DockerSandbox, box), root=str(tmp_path))
    how = "took too long" if timed_out else "was killed"

    for use in (lambda: workspace.write_text("app.py", "x = 2\n"),
                lambda: workspace.read_text("app.py"),
                lambda: workspace.exists("app.py")):  # fmt: skip
        with pytest.raises(ToolError, match=f"looking up 'app.py' in the sandbox {how}"):
            use()
    assert (tmp_path / "app.py").read_text() == "x = 1\n"  # nothing written

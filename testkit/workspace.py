"""An in-process `Workspace`: a git working copy on this host, for tests.

It runs the code tools' commands on the host, contained only by a time limit and a scrubbed
environment: a test double, never a place for a model's commands in production (Baton's own
workspaces are Docker sandboxes, `workers.tools.container`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.core.git import LOCAL_GIT_TIMEOUT_S, git_env, git_said, redact, run_git
from testkit.process import first_lines, run_capped
from workers.tools.errors import ToolError
from workers.tools.workspace import (
    APPLY_FLAGS,
    DIFF_ARGS,
    LIST_LIMIT,
    MAX_MATCH_CHARS,
    MAX_READ_BYTES,
    SEARCH_LIMIT,
    SEARCH_TIMEOUT_S,
    CommandResult,
    checked_path,
    listed_files,
    rg_argv,
)

MAX_OUTPUT_BYTES = 256_000
"""Output of a command kept by `run`: its head and tail."""


class LocalWorkspace:
    """A `Workspace` on a git working copy on this host, such as `RepoCache.checkout` makes.

    Paths are confined to the working copy: absolute paths, `..`, `.git` and symlinks leading
    outside are refused. Commands run without a shell, with a scrubbed environment (secrets in
    this process's environment never reach them), a time limit that kills their whole process
    group, and capped output. Their PATH starts with this interpreter's directory, so `python`
    and `pytest` are the worker's own. They are not otherwise contained: untrusted code belongs
    in a sandbox.
    """

    def __init__(self, path: Path, *, max_output_bytes: int = MAX_OUTPUT_BYTES) -> None:
        self.path = path
        self.max_output_bytes = max_output_bytes

    @property
    def root(self) -> str:
        return str(self.path)

    def exists(self, path: str) -> bool:
        return self._resolve(path).exists()

    def read_text(self, path: str) -> str:
        file = self._resolve(path)
        if not file.is_file():
            raise ToolError(f"no file {path!r}; list_files shows the files that exist")
        size = file.stat().st_size
        if size > MAX_READ_BYTES:
            raise ToolError(f"{path} is {size} bytes, too big to read; search it instead")
        try:
            return file.read_bytes().decode()
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text (a binary file?)") from None

    def write_text(self, path: str, text: str) -> None:
        file = self._resolve(path)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(text.encode())
        except OSError as exc:
            raise ToolError(f"cannot write {path}: {exc.strerror}") from None

    def list_files(
        self, path: str = ".", glob: str | None = None, limit: int = LIST_LIMIT
    ) -> list[str]:
        return listed_files(self._git, self._existing(path), glob, limit)

    def search(
        self, pattern: str, path: str = ".", glob: str | None = None, limit: int = SEARCH_LIMIT
    ) -> list[str]:
        if not pattern:
            raise ToolError("the search pattern is empty")
        where = self._existing(path)
        rg = shutil.which("rg", path=git_env()["PATH"])
        argv = rg_argv(rg, pattern, where, glob) if rg else _git_grep_argv(pattern, where, glob)
        try:
            lines, exit_code, errors = first_lines(
                argv, cwd=self.path, env=git_env(), limit=limit, timeout_s=SEARCH_TIMEOUT_S
            )
        except TimeoutError:
            raise ToolError(f"the search took over {SEARCH_TIMEOUT_S:g} s; narrow it") from None
        if exit_code not in (0, 1) and not lines:  # 1: nothing matched
            raise ToolError(f"search failed: {errors.strip()[-500:] or f'exit code {exit_code}'}")
        return [line.removeprefix("./")[:MAX_MATCH_CHARS] for line in lines]

    def run(
        self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        if not argv:
            raise ToolError("the command is empty")
        with tempfile.TemporaryDirectory(prefix="baton-home-") as home:
            scrubbed = {
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), git_env()["PATH"]]),
                "HOME": home,
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                **(env or {}),
            }
            try:
                return run_capped(
                    argv,
                    cwd=self.path,
                    env=scrubbed,
                    timeout_s=timeout_s,
                    max_output_bytes=self.max_output_bytes,
                )
            except (FileNotFoundError, PermissionError) as exc:
                raise ToolError(f"cannot run {argv[0]!r}: {exc.strerror}") from None

    def diff(self) -> str:
        self._git("add", "--intent-to-add", "--all")  # so that new files show up
        return self._git(*DIFF_ARGS)

    def apply_patch(self, patch: str) -> None:
        if not patch.strip():
            raise ToolError("the patch is empty")
        patch = patch if patch.endswith("\n") else patch + "\n"
        failures = []
        for flags in APPLY_FLAGS:
            check = run_git(["-C", self.root, "apply", *flags, "--check", "-"], stdin=patch)
            if check.returncode == 0:
                self._git("apply", *flags, "-", stdin=patch)
                return
            failures.append(git_said(check))
        raise ToolError(f"the patch does not apply; nothing changed: {failures[0]}")

    # -- helpers ------------------------------------------------------------------------------

    def _resolve(self, path: str) -> Path:
        """The real location of a path the model gave, refused unless inside the root."""
        relative = checked_path(path)
        root = self.path.resolve()
        full = (root / relative).resolve()
        if not full.is_relative_to(root):
            raise ToolError(f"{path!r} leads outside the repository through a symlink")
        if ".git" in full.relative_to(root).parts:
            raise ToolError(f"{path!r} is inside .git, which tools do not touch")
        return full

    def _existing(self, path: str) -> str:
        """`path` relative to the root, after checking that it is safe and exists."""
        full = self._resolve(path)
        if not full.exists():
            raise ToolError(f"no file or directory {path!r}; list_files shows what exists")
        return full.relative_to(self.path.resolve()).as_posix()

    def _git(self, *args: str, stdin: str = "") -> str:
        """The output of a git command that must succeed; else a `ToolError` quoting git."""
        command = args[0]
        try:
            result = run_git(["-C", self.root, *args], stdin=stdin)
        except subprocess.TimeoutExpired:
            raise ToolError(f"git {command} took over {LOCAL_GIT_TIMEOUT_S:g} s") from None
        if result.returncode != 0:
            raise ToolError(f"git {command} failed: {redact(git_said(result))}")
        return result.stdout.decode(errors="replace")


def _git_grep_argv(pattern: str, where: str, glob: str | None) -> list[str]:
    argv = ["git", "grep", "-n", "-I", "--untracked", "-E", "-e", pattern, "--"]
    if not glob:
        return [*argv, where]
    prefix = "" if where == "." else f"{where}/"
    return [*argv, f":(glob){prefix}{glob if '/' in glob else '**/' + glob}"]

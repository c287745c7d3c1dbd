"""The workspace the code tools work in: its interface, and a git working copy on this host.

The tools see only `Workspace`, so a sandboxed implementation (a Docker container holding the
working copy) replaces `LocalWorkspace` without touching them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Protocol

from orchestrator.repo import GIT_TIMEOUT_S, git_env, git_message, redact, run_git
from workers.tools.errors import ToolError
from workers.tools.process import CommandResult, first_lines, run_capped

__all__ = ["CommandResult", "LocalWorkspace", "Workspace"]

DIFF_ARGS = (
    "diff", "--binary", "--no-color", "--no-ext-diff",
    "--src-prefix=a/", "--dst-prefix=b/",  # whatever the user's config says
    "HEAD",
)  # fmt: skip
"""`git` arguments of a workspace's diff: the working tree (new files added with
`--intent-to-add` first) against HEAD, as a patch `apply_patch` accepts."""
APPLY_FLAGS = (("--recount",), ("--recount", "--unidiff-zero"))
"""`git apply` flags to try in turn. `--recount`: hunk line counts need not be right.
`--unidiff-zero`, tried second: a hunk with context on one side only need not sit at the
file's start or end. Models write both kinds of patch."""
LIST_LIMIT = 2_000
"""Default cap on the paths `list_files` returns."""
SEARCH_LIMIT = 1_000
"""Default cap on the lines `search` returns."""
MAX_MATCH_CHARS = 300
"""A matching line longer than this is cut (minified code has megabyte lines)."""
MAX_READ_BYTES = 2_000_000
"""`read_text` refuses files larger than this."""
MAX_OUTPUT_BYTES = 256_000
"""Output of a command kept by `run`: its head and tail."""
SEARCH_TIMEOUT_S = 60.0


class Workspace(Protocol):
    """A repository checkout that the code tools read, change and test.

    Every path is relative to the root and `/`-separated. Whatever the model can correct (a
    missing file, a path outside the root, a patch that does not apply) raises `ToolError`.
    """

    @property
    def root(self) -> str:
        """Where the workspace is, for display."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a file or directory is at `path`."""
        ...

    def read_text(self, path: str) -> str:
        """The file's text, newlines as they are in the file."""
        ...

    def write_text(self, path: str, text: str) -> None:
        """Create or replace the file, creating its directories."""
        ...

    def list_files(
        self, path: str = ".", glob: str | None = None, limit: int = LIST_LIMIT
    ) -> list[str]:
        """Files under `path` that git does not ignore, sorted, at most `limit` of them.

        `glob` without a `/` matches file names (`*.py`), with one whole paths (`src/*/x.py`).
        """
        ...

    def search(
        self, pattern: str, path: str = ".", glob: str | None = None, limit: int = SEARCH_LIMIT
    ) -> list[str]:
        """Lines matching the regular expression, as `path:line:text`, at most `limit`."""
        ...

    def run(
        self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run a command (no shell) at the root, with a scrubbed environment plus `env`."""
        ...

    def diff(self) -> str:
        """The working tree against HEAD as a patch `apply_patch` accepts, new files included."""
        ...

    def apply_patch(self, patch: str) -> None:
        """Apply a unified diff to the working tree, all of it or nothing."""
        ...


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
            failures.append(git_message(check))
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

    def _git(self, *args: str, stdin: str | None = None) -> str:
        command = args[0]
        try:
            result = run_git(["-C", self.root, *args], timeout_s=GIT_TIMEOUT_S, stdin=stdin)
        except subprocess.TimeoutExpired:
            raise ToolError(f"git {command} took over {GIT_TIMEOUT_S:g} s") from None
        if result.returncode != 0:
            raise ToolError(f"git {command} failed: {redact(git_message(result))}")
        return result.stdout


def checked_path(path: str) -> PurePosixPath:
    """A path the model gave, as a relative path; absolute paths, `~` and `..` are refused."""
    relative = PurePosixPath(path or ".")
    if "\0" in path or relative.is_absolute() or path.startswith("~"):
        raise ToolError(f"{path!r} is not a relative path; give one from the repository root")
    if ".." in relative.parts:
        raise ToolError(f"{path!r} goes up with '..'; give a path from the repository root")
    if ".git" in relative.parts:
        raise ToolError(f"{path!r} is inside .git, which tools do not touch")
    return relative


def listed_files(git: Callable[..., str], where: str, glob: str | None, limit: int) -> list[str]:
    """The files below `where` that git tracks or would add (not ignored ones), less the
    tracked ones deleted from the working tree, matching `glob`: the first `limit`, sorted.
    `git(*args)` runs git in the working copy and returns its output."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", where)
    deleted = git("ls-files", "-z", "--deleted", "--", where)
    names = set(listed.split("\0")) - set(deleted.split("\0"))
    return sorted(name for name in names if name and glob_matches(name, glob))[:limit]


def glob_matches(name: str, glob: str | None) -> bool:
    if not glob:
        return True
    return fnmatchcase(name if "/" in glob else name.rsplit("/", 1)[-1], glob)


def rg_argv(rg: str, pattern: str, where: str, glob: str | None) -> list[str]:
    argv = [rg, "--line-number", "--no-heading", "--color", "never", "--hidden", "--sort", "path"]
    argv += ["--max-columns", str(MAX_MATCH_CHARS), "--max-columns-preview", "--glob", "!.git"]
    if glob:
        argv += ["--glob", glob]
    return [*argv, "--regexp", pattern, "--", where]


def _git_grep_argv(pattern: str, where: str, glob: str | None) -> list[str]:
    argv = ["git", "grep", "-n", "-I", "--untracked", "-E", "-e", pattern, "--"]
    if not glob:
        return [*argv, where]
    prefix = "" if where == "." else f"{where}/"
    return [*argv, f":(glob){prefix}{glob if '/' in glob else '**/' + glob}"]

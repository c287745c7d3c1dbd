"""A `Workspace` inside a Docker sandbox: the code tools' view of a container's /workspace.

Every command, search and git call runs in the container, as its unprivileged user, with no
network; only file bytes and command output cross into the worker. Paths are checked on this
side too, so a model's `../x` is refused before it reaches the container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

from orchestrator.core.git import LOCAL_GIT_TIMEOUT_S
from sandbox import DockerSandbox, SandboxError
from workers.rebuild import Rebuild, ignore_pattern
from workers.timings import BUILD, CHANGES, COMMANDS, timed
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

MAX_DIFF_BYTES = 8_000_000
"""A diff larger than this is refused rather than handed on cut."""
EXCLUDE_FILE = ".git/info/exclude"


REAL_PATH = 'p=$(realpath {flag} -- "$1") && [ {kind} "$p" ] && printf %s "$p"'
"""Prints where `$1` really is, if `realpath {flag}` resolves it and `test {kind}` holds."""


class ContainerWorkspace:
    """The git working copy at `root` inside a running sandbox."""

    def __init__(
        self, box: DockerSandbox, *, root: str = "/workspace", rebuild: Rebuild | None = None
    ) -> None:
        self.box = box
        self._root = root
        self.rebuild = rebuild
        """The environment's build step, run before a command whenever the change needs it."""

    @property
    def root(self) -> str:
        return self._root

    def exists(self, path: str) -> bool:
        return self._real(path, must_exist=True) is not None

    def read_text(self, path: str) -> str:
        full = self._real(path, must_exist=True, kind="-f")
        if full is None:
            raise ToolError(f"no file {path!r}; list_files shows the files that exist")
        try:
            data = self.box.read_file(full, max_bytes=MAX_READ_BYTES)
        except SandboxError as exc:
            raise ToolError(f"cannot read {path}: {exc}") from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text (a binary file?)") from None

    def write_text(self, path: str, text: str) -> None:
        full = self._real(path, must_exist=False)
        assert full is not None  # raised above unless it resolved
        try:
            self.box.write_file(full, text.encode())
        except SandboxError as exc:  # a read-only file, say: the model can choose another way
            raise ToolError(f"cannot write {path}: {exc}") from None

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
        result = self._exec(rg_argv("rg", pattern, where, glob), timeout_s=SEARCH_TIMEOUT_S)
        if result.timed_out:
            raise ToolError(f"the search took over {SEARCH_TIMEOUT_S:g} s; narrow it")
        lines = [line for line in result.output.splitlines() if line]
        if result.exit_code not in (0, 1) and not lines:  # 1: nothing matched
            raise ToolError(f"search failed: {result.output.strip()[-500:]}")
        if result.exit_code not in (0, 1):
            lines = [line for line in lines if ":" in line and not line.startswith("rg: ")]
        return [line.removeprefix("./")[:MAX_MATCH_CHARS] for line in lines[:limit]]

    def run(
        self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        if not argv:
            raise ToolError("the command is empty")
        if self.rebuild is not None:
            with timed(BUILD):
                self.rebuild.ensure(
                    lambda command, limit_s: self._exec(command, timeout_s=limit_s), self.exclude
                )
        with timed(COMMANDS):
            return self._exec(argv, timeout_s=timeout_s, env=env)

    def diff(self) -> str:
        with timed(CHANGES):
            return self._diff()

    def apply_patch(self, patch: str) -> None:
        with timed(CHANGES):
            self._apply_patch(patch)

    def _diff(self) -> str:
        # One exec: every round trip into the sandbox costs more than git's own work here.
        result = self._exec(
            ["sh", "-c", 'git add --intent-to-add --all && exec git "$@"', "sh", *DIFF_ARGS],
            timeout_s=LOCAL_GIT_TIMEOUT_S, max_output_bytes=MAX_DIFF_BYTES,
        )  # fmt: skip
        if result.exit_code != 0:
            raise ToolError(f"git diff exited {result.exit_code}: {result.output.strip()[-500:]}")
        if result.truncated:
            raise ToolError(f"the diff is over {MAX_DIFF_BYTES} bytes; make a smaller change")
        return result.output

    def _apply_patch(self, patch: str) -> None:
        """`git apply` reading the patch from its stdin: one exec per set of flags tried, and
        git applies all of a patch or nothing, so a failed try changed nothing."""
        if not patch.strip():
            raise ToolError("the patch is empty")
        data = (patch if patch.endswith("\n") else patch + "\n").encode()
        failures = []
        for flags in APPLY_FLAGS:
            applied = self._run_git("apply", *flags, stdin=data)
            if applied.timed_out:
                raise ToolError(f"git apply took over {LOCAL_GIT_TIMEOUT_S:g} s")
            if applied.exit_code == 0:
                return
            failures.append(applied.output.strip()[-500:])
        raise ToolError(f"the patch does not apply; nothing changed: {failures[0]}")

    def exclude(self, paths: Iterable[str]) -> None:
        """Hide `paths` (new build products) from the change: git ignores them from now on."""
        lines = "".join(f"{ignore_pattern(path)}\n" for path in paths)
        if lines:
            appended = self._exec(
                ["sh", "-c", 'cat >> "$1"', "sh", EXCLUDE_FILE],
                timeout_s=LOCAL_GIT_TIMEOUT_S, stdin=lines.encode(),
            )  # fmt: skip
            if appended.exit_code != 0:
                raise ToolError(f"could not hide the build's products: {appended.output[-300:]}")

    # -- helpers ------------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return str(PurePosixPath(self._root) / checked_path(path))

    def _existing(self, path: str) -> str:
        relative = checked_path(path).as_posix()
        if not self.exists(relative):
            raise ToolError(f"no file or directory {path!r}; list_files shows what exists")
        return relative

    def _real(self, path: str, *, must_exist: bool, kind: str = "-e") -> str | None:
        """Where `path` really is, symlinks followed, in one exec: None if it must exist and
        does not (or is not of `kind`, a `test` flag); refused when it leads outside the
        workspace (a symlink to `..` or `/etc`) or into `.git`, and when the sandbox did not
        answer (the lookup timed out or was killed): that says nothing of the file."""
        full = self._full(path)
        flag, kind = ("-e", kind) if must_exist else ("-m", "-n")
        result = self._exec(["sh", "-c", REAL_PATH.format(flag=flag, kind=kind), "sh", full])
        if result.timed_out or result.oom_killed or result.exit_code < 0:
            # The sandbox did not answer the question: saying the file is absent would be wrong.
            how = "took too long" if result.timed_out else "was killed"
            raise ToolError(f"looking up {path!r} in the sandbox {how}; try again")
        if result.exit_code != 0:
            if must_exist:
                return None
            raise ToolError(f"{path!r} cannot be resolved: {result.output.strip()[-300:]}")
        real = PurePosixPath(result.output.strip())
        if not real.is_relative_to(self._root):
            raise ToolError(f"{path!r} leads outside the repository through a symlink")
        if ".git" in real.relative_to(self._root).parts:
            raise ToolError(f"{path!r} is inside .git, which tools do not touch")
        return str(real)

    def _git(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        """The output of a git command that must succeed; else a `ToolError` quoting git."""
        result = self._run_git(*args, env=env)
        if result.timed_out:
            raise ToolError(f"git {args[0]} took over {LOCAL_GIT_TIMEOUT_S:g} s")
        if result.exit_code != 0:
            raise ToolError(f"git {args[0]} failed: {result.output.strip()[-500:]}")
        return result.output

    def _run_git(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """`git *args` in the workspace, within the time limit of all local git."""
        argv = ["git", *args]
        return self._exec(
            argv, timeout_s=LOCAL_GIT_TIMEOUT_S, env=env, max_output_bytes=max_output_bytes,
            stdin=stdin,
        )  # fmt: skip

    def _exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        result = self.box.exec(
            list(argv), timeout_s=timeout_s, workdir=self._root, env=env,
            max_output_bytes=max_output_bytes, stdin=stdin,
        )  # fmt: skip
        return CommandResult(
            exit_code=-9 if result.exit_code is None else result.exit_code,
            output=result.output,
            timed_out=result.timed_out,
            truncated=result.truncated,
            oom_killed=result.oom_killed,
        )

"""The workspace the code tools work in: its interface, and the helpers its implementations
share.

The tools see only `Workspace`. Baton's implementation is a git working copy inside a Docker
sandbox (`workers.tools.container.ContainerWorkspace`); tests use an in-process one on a working
copy of the host (`testkit.workspace.LocalWorkspace`) through the same interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from typing import Protocol

from workers.tools.errors import ToolError

__all__ = ["CommandResult", "Workspace"]

DIFF_ARGS = (
    "diff", "--binary", "--no-color", "--no-ext-diff",
    "--src-prefix=a/", "--dst-prefix=b/",  # whatever the user's config says
    "HEAD",
)  # fmt: skip
"""`git` arguments of a workspace's diff: the working tree (new files added with
`--intent-to-add` first) against HEAD, as a patch `apply_patch` accepts."""
TEST_BYPRODUCTS = (
    ".coverage", ".coverage.*", "coverage.xml", "htmlcov/", ".pytest_cache/", "__pycache__/",
    "*.py[cod]", ".hypothesis/", ".tox/", ".nox/", ".mypy_cache/", ".ruff_cache/", "*.egg-info/",
    ".eggs/", "junit*.xml", ".nyc_output/", "node_modules/.cache/",
)  # fmt: skip
"""Files that running tests and tools leave behind (pytest-cov's `.coverage`, caches, bytecode):
never part of a change, whatever the repository's `.gitignore` says (a published source
distribution has none). Written to the workspace's `.git/info/exclude`; a tracked file of the
same name still shows its changes."""

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
SEARCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its exit code and its combined stdout and stderr."""

    exit_code: int
    """The exit code; negative when a signal ended the command (-9 after a timeout)."""
    output: str
    """Stdout and stderr interleaved; when `truncated`, its head and tail with a marker."""
    timed_out: bool
    """The time limit passed and the command's whole process group was killed."""
    truncated: bool
    """The command wrote more than the cap; the middle of its output is not kept."""
    oom_killed: bool = False
    """The kernel killed it for using more memory than its sandbox allows."""


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

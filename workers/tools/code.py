"""The code tools: what a stage's model calls to read, change, test and publish code.

`build_tools` returns plain functions for one stage execution over one workspace. ADK declares
each to the model by its name, signature and docstring, so the docstrings are written for the
model. Every tool returns a small JSON-ready dict; a `ToolError` becomes `{"error": message}`,
which the model reads and can act on. Big things (test logs, diffs) go to the artifact sink and
only their uri comes back.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.core.tools import BUILTIN_TOOLS
from workers.timings import TOOLS, timed
from workers.tools.artifacts import ArtifactSink
from workers.tools.errors import ToolError
from workers.tools.workspace import Workspace

Tool = Callable[..., dict[str, Any]]

TOOL_NAMES = BUILTIN_TOOLS
MAX_FILES = 200
"""Paths one `list_files` call shows."""
MAX_MATCHES = 50
"""Matching lines one `search_code` call shows."""
MAX_COUNTED = 1_000
"""Paths or matches counted beyond those shown; past this the count says `N+`."""
MAX_READ_LINES = 400
"""Lines one `read_file` call shows."""
MAX_LINE_CHARS = 500
"""A longer line is cut when shown."""
MAX_TEST_TAIL_CHARS = 3_000
"""The end of a test run's output that `run_tests` shows; the full log is an artifact."""
MAX_DIFF_CHARS = 6_000
"""The head and tail of the diff that `show_diff` shows; the full diff is an artifact."""
DIFF_ARTIFACT = "workspace.diff"
"""The artifact holding a code stage's changes, which the stages after it start from."""
TEST_ENV = {"PYTEST_ADDOPTS": "-p no:cacheprovider"}
"""Keeps pytest from leaving a `.pytest_cache` in the diff."""
SHELL_OPERATORS = frozenset({"&&", "||", "|", ";", ">", ">>", "<", "&"})


Publish = Callable[[str, str, str], dict[str, Any]]
"""Publishes a diff with a title and a body, on the worker host; returns what to tell the model."""


def build_tools(
    names: Sequence[str],
    ws: Workspace,
    artifacts: ArtifactSink,
    *,
    test_timeout_s: float = 120,
    publish: Publish | None = None,
) -> list[Tool]:
    """The tools called `names`, working on `ws`; `publish` hands the diff to `publish`.

    Raises `ValueError` for a name that is not a tool.
    """
    unknown = [name for name in names if name not in TOOL_NAMES]
    if unknown:
        raise ValueError(
            f"unknown tool {', '.join(unknown)}; the tools are {', '.join(TOOL_NAMES)}"
        )
    tools = _CodeTools(ws, artifacts, test_timeout_s=test_timeout_s, publish=publish)
    return [_model_facing(getattr(tools, name)) for name in names]


def _model_facing(tool: Tool) -> Tool:
    """`tool` with a `ToolError` returned to the model instead of raised."""

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            with timed(TOOLS):
                return tool(*args, **kwargs)
        except ToolError as exc:
            return {"error": exc.message}

    return call


class _CodeTools:
    """The tools of one stage execution; each public method is one tool."""

    def __init__(
        self,
        ws: Workspace,
        artifacts: ArtifactSink,
        *,
        test_timeout_s: float,
        publish: Publish | None,
    ) -> None:
        self._ws = ws
        self._artifacts = artifacts
        self._test_timeout_s = test_timeout_s
        self._publish = publish
        self._test_runs = 0

    def list_files(self, path: str = ".", glob: str = "") -> dict[str, Any]:
        """List the repository's files (files ignored by git are left out).

        Args:
            path: Directory to list, relative to the repository root.
            glob: Optional filter: "*.py" matches file names, "src/*/models.py" whole paths.
        """
        files = self._ws.list_files(path, glob or None, limit=MAX_COUNTED)
        return _page("files", files, MAX_FILES, "give a narrower path or glob")

    def search_code(self, pattern: str, path: str = ".", glob: str = "") -> dict[str, Any]:
        """Search the repository's files for a regular expression (ripgrep syntax).

        Returns matching lines as "path:line:text".

        Args:
            pattern: Regular expression, e.g. "def checkout" or "class \\w+Error".
            path: File or directory to search, relative to the repository root.
            glob: Optional filter on files: "*.py" matches file names, "src/*/x.py" paths.
        """
        matches = self._ws.search(pattern, path, glob or None, limit=MAX_COUNTED)
        return _page("matches", matches, MAX_MATCHES, "give a narrower pattern, path or glob")

    def read_file(self, path: str, start_line: int = 1, end_line: int = 0) -> dict[str, Any]:
        """Read lines of a file, numbered ("  12| text"), at most 400 lines per call.

        Args:
            path: File, relative to the repository root.
            start_line: First line to show (1-based).
            end_line: Last line to show; 0 means the end of the file.
        """
        if start_line < 1 or end_line < 0 or (end_line and end_line < start_line):
            raise ToolError("need 1 <= start_line <= end_line, or end_line 0 for the end")
        lines = _lines(self._ws.read_text(path))
        if not lines:
            return {"path": path, "total_lines": 0, "content": "", "note": "the file is empty"}
        if start_line > len(lines):
            raise ToolError(
                f"start_line {start_line} is past the end: {path} has {len(lines)} lines"
            )
        wanted = min(end_line or len(lines), len(lines))
        last = min(wanted, start_line + MAX_READ_LINES - 1)
        width = max(4, len(str(last)))
        numbered = (f"{n:>{width}}| {_cut(lines[n - 1])}" for n in range(start_line, last + 1))
        result: dict[str, Any] = {
            "path": path,
            "start_line": start_line,
            "end_line": last,
            "total_lines": len(lines),
            "content": "\n".join(numbered),
        }
        if last < wanted:
            result["note"] = f"{MAX_READ_LINES} lines at most per call; continue at {last + 1}"
        return result

    def edit_file(self, path: str, old_text: str, new_text: str) -> dict[str, Any]:
        """Replace one exact occurrence of old_text in a file with new_text.

        old_text must occur exactly once: copy it from read_file without the line numbers,
        with its indentation, and add neighbouring lines if it is not unique. With an empty
        old_text, creates a new file holding new_text.

        Args:
            path: File, relative to the repository root.
            old_text: The exact text to replace; empty to create a new file.
            new_text: The text to put in its place.
        """
        if not old_text:
            if self._ws.exists(path):
                raise ToolError(f"{path} exists; give old_text, the exact text to replace")
            self._ws.write_text(path, new_text)
            return {"path": path, "created": True}
        text = self._ws.read_text(path)
        old_text, new_text = _same_newlines(text, old_text, new_text)
        count = text.count(old_text)
        if count == 0:
            raise ToolError(
                f"old_text was not found in {path}; read the lines again and copy them exactly"
            )
        if count > 1:
            raise ToolError(
                f"old_text occurs {count} times in {path}; add neighbouring lines to make it unique"
            )
        self._ws.write_text(path, text.replace(old_text, new_text, 1))
        return {"path": path, "replaced_at_line": text[: text.index(old_text)].count("\n") + 1}

    def apply_patch(self, patch: str) -> dict[str, Any]:
        """Apply a unified diff to the repository (as `git diff` prints it: a/ and b/ paths).

        The whole patch applies, or nothing changes and the error says why.

        Args:
            patch: The unified diff.
        """
        self._ws.apply_patch(patch)
        return {"applied": True}

    def run_tests(self, command: str) -> dict[str, Any]:
        """Run a test command in the repository root, e.g. "pytest -q tests/test_cart.py".

        One command without a shell: no pipes, `&&`, redirections or variables. Returns
        whether it passed, the end of its output and the uri of the full log.

        Args:
            command: The command line.
        """
        argv = split_command(command)
        result = self._ws.run(argv, timeout_s=self._test_timeout_s, env=TEST_ENV)
        self._test_runs += 1
        ending = f"exit code {result.exit_code}" + (", timed out" if result.timed_out else "")
        log = f"$ {command}\n{result.output}\n[{ending}]\n"
        uri = self._artifacts.save(f"test-log-{self._test_runs}.txt", log.encode())
        summary: dict[str, Any] = {
            "exit_code": result.exit_code,
            "passed": result.exit_code == 0 and not result.timed_out,
            "timed_out": result.timed_out,
            "output_tail": result.output[-MAX_TEST_TAIL_CHARS:],
            "log": uri,
        }
        if result.timed_out:
            summary["note"] = f"killed after {self._test_timeout_s:g} s"
        return summary

    def show_diff(self) -> dict[str, Any]:
        """Show the changes made so far: a unified diff against the checked-out commit."""
        diff = self._ws.diff()
        if not diff:
            return {"diff": "", "files": [], "note": "no changes in the working tree"}
        uri = self._artifacts.save(DIFF_ARTIFACT, diff.encode(), "text/x-diff")
        files = [
            line.rsplit(" b/", 1)[-1]
            for line in diff.splitlines()
            if line.startswith("diff --git ")
        ]
        shown = diff
        if len(diff) > MAX_DIFF_CHARS:
            half, cut = MAX_DIFF_CHARS // 2, len(diff) - MAX_DIFF_CHARS
            shown = f"{diff[:half]}\n[… {cut} chars cut; the full diff: {uri} …]\n{diff[-half:]}"
        return {"diff": shown, "files": files, "chars": len(diff), "artifact": uri}

    def publish(self, title: str, body: str) -> dict[str, Any]:
        """Publish the finished change: commit it on the run's branch, push it and, for a
        GitHub repository, open a pull request. Returns the branch and the commit.

        Args:
            title: One line: the commit subject and pull request title.
            body: The failure, its cause and the change; measured test results are added.
        """
        title = title.strip()
        if not title or "\n" in title:
            raise ToolError("the title must be one non-empty line")
        if self._publish is None:
            raise ToolError("publishing is not available to this stage")
        diff = self._ws.diff()
        if not diff:
            raise ToolError("nothing to publish: the working tree has no changes")
        return self._publish(title, body.strip(), diff)


def split_command(command: str) -> list[str]:
    """One command line, split like a shell would but run without one.

    Raises:
        ToolError: it cannot be parsed, is empty, or uses shell operators.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ToolError(f"cannot parse the command: {exc}") from None
    if not argv or SHELL_OPERATORS & set(argv):
        raise ToolError("give one command, without shell operators such as && or |")
    return argv


def _page(key: str, items: list[str], shown_max: int, narrow: str) -> dict[str, Any]:
    """The first `shown_max` items under `key`, with a count and a note when some are left out."""
    result: dict[str, Any] = {key: items[:shown_max], "count": len(items)}
    omitted = len(items) - shown_max
    if omitted > 0:
        more = f"{omitted}+" if len(items) >= MAX_COUNTED else str(omitted)
        result["omitted"] = omitted
        result["note"] = f"{more} more {key} not shown; {narrow}"
    return result


def _lines(text: str) -> list[str]:
    """Lines as editors and `rg` number them (only `\\n` ends a line)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f"[… {len(line) - MAX_LINE_CHARS} chars cut]"


def _same_newlines(text: str, old_text: str, new_text: str) -> tuple[str, str]:
    """old_text and new_text with CRLF line ends when the file has them and they do not."""
    if "\r\n" in text and "\r\n" not in old_text:
        return old_text.replace("\n", "\r\n"), new_text.replace("\n", "\r\n")
    return old_text, new_text

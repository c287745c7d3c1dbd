"""Build products in a sandbox: which of them git must not see, and the build step that keeps
them current.

An environment image keeps what its setup built in the workspace (`sandbox.products`), and a
sandbox lays its run's commit over it. Two things follow:

* The products are not the change. `excluded(products, tracked)` says which of them the
  workspace's git ignores (`.git/info/exclude`, anchored paths) — not one the run's commit
  tracks, which is the commit's file — and which tracked files, inside a product folder, must be
  added to the baseline by name.
* A product is only as new as what it was built from. `Rebuild` runs the spec's `build`
  commands, in the sandbox and offline, before a command runs there whenever the files the
  spec's `build_inputs` name differ from those the products were last built from: at first
  from the image's commit (`stale`), later from the state of the last build. Each build is
  reported (`BuildRun`: command, exit status, time, output); a failing one is a `ToolError`
  the model reads, and the next command tries again.

An untracked product whose source changed is stale until the build step runs; the step runs
before any command does, so no test sees it stale. A product no build step remakes (the spec
has no `build`) stays as the image's setup made it.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sandbox.products import tracked_folders
from workers.tools.errors import ToolError
from workers.tools.workspace import CommandResult

logger = logging.getLogger(__name__)

FINGERPRINT = (
    'git add --intent-to-add --all && git diff HEAD --binary --no-color --no-ext-diff -- "$@" '
    "> /tmp/.baton-build-inputs && sha256sum < /tmp/.baton-build-inputs"
)
"""Prints a hash of how the build inputs (the arguments, git pathspecs; none: every file)
differ from the baseline, new files included: equal hashes, equal inputs."""
NEW_UNTRACKED = ["git", "ls-files", "-z", "--others", "--exclude-standard", "--directory"]
"""What is in the workspace that git neither tracks nor ignores: after a build, its products."""
BUILD_TAIL_LINES = 40
GIT_TIMEOUT_S = 120.0
SPECIAL = frozenset("\\*?[")


@dataclass(frozen=True)
class BuildRun:
    """One run of the build step."""

    commands: tuple[str, ...]
    exit_code: int | None
    """Of the last command run; None when it timed out."""
    duration_s: float
    output: str = field(repr=False)
    failed_command: str | None = None

    @property
    def log(self) -> str:
        ending = "ok" if self.failed_command is None else f"failed: {self.failed_command}"
        return f"{self.output}\n[build {ending} in {self.duration_s:.1f}s]\n"


@dataclass
class Rebuild:
    """The spec's build step for one workspace (see the module's documentation)."""

    commands: Sequence[str]
    inputs: Sequence[str] = ()
    """Git pathspecs of the files whose change needs a build; empty: every file."""
    stale: bool = True
    """The products were built from another tree than the baseline's (in the inputs)."""
    timeout_s: float = 1800.0
    on_build: Callable[[BuildRun], None] | None = None
    built: str | None = field(default=None, init=False)
    """The inputs' fingerprint the products were last built from (None: unknown)."""

    def ensure(self, run: Exec, exclude: Callable[[Iterable[str]], None]) -> BuildRun | None:
        """Build if the inputs differ from the last build's; the build, or None if none was
        needed. `run` runs an argv in the workspace (at most so many seconds); `exclude` hides
        new products from git.

        Raises:
            ToolError: a build command failed or timed out (the message ends with its output).
        """
        now = self._fingerprint(run)
        if now == self.built or (self.built is None and not self.stale and now == UNCHANGED):
            self.built = now
            return None
        started = time.monotonic()
        outputs: list[str] = []
        exit_code: int | None = 0
        failed = None
        for command in self.commands:
            result = run(["sh", "-c", command], self.timeout_s)
            outputs.append(f"$ {command}\n{result.output}")
            exit_code = None if result.timed_out else result.exit_code
            if result.timed_out or result.exit_code != 0:
                failed = command
                break
        took_s = round(time.monotonic() - started, 3)
        ran = BuildRun(tuple(self.commands), exit_code, took_s, "".join(outputs), failed)
        new = run(NEW_UNTRACKED, GIT_TIMEOUT_S)
        exclude(name for name in new.output.split("\0") if name)
        if self.on_build is not None:
            self.on_build(ran)
        if failed is not None:
            how = "timed out" if exit_code is None else f"exited with {exit_code}"
            tail = "\n".join(outputs[-1].rstrip().splitlines()[-BUILD_TAIL_LINES:])
            raise ToolError(
                f"the build step `{failed}` {how} after {took_s:.1f}s, so nothing was run on "
                f"the change; fix what it says and run again:\n{tail}"
            )
        self.built = self._fingerprint(run)
        return ran

    def _fingerprint(self, run: Exec) -> str:
        result = run(["sh", "-c", FINGERPRINT, "sh", *self.inputs], GIT_TIMEOUT_S)
        words = result.output.split()
        if result.timed_out or result.exit_code != 0 or not words:
            raise ToolError(
                f"could not tell whether the change needs a build: {result.output[-500:]}"
            )
        return words[0]


Exec = Callable[[Sequence[str], float], CommandResult]

UNCHANGED = hashlib.sha256(b"").hexdigest()
"""The fingerprint of no difference at all from the baseline."""


def excluded(products: Iterable[str], tracked: Iterable[str]) -> tuple[list[str], list[str]]:
    """The ignore patterns that hide `products` (paths, folders ending in `/`) from git, and the
    `tracked` paths (the run's commit) inside a hidden folder, which the baseline must add by
    name. A product the commit tracks is the commit's file: not hidden."""
    names = sorted(tracked)
    known = set(names)
    patterns: list[str] = []
    forced: list[str] = []
    for product in products:
        bare = product.rstrip("/")
        if not bare or bare in known:
            continue
        patterns.append(ignore_pattern(product))
        if product.endswith("/"):
            start = bisect.bisect_left(names, bare + "/")
            end = bisect.bisect_left(names, bare + "0")  # "0" follows "/" in code points
            forced += names[start:end]
    return patterns, forced


def ignore_pattern(path: str) -> str:
    """A `.gitignore` line matching exactly `path` from the root (a folder if it ends in `/`):
    wildcards and backslashes escaped, trailing spaces kept, a newline (which no pattern can
    hold) matched by `?`."""
    folder = path.endswith("/")
    bare = path.rstrip("/")
    kept = bare.rstrip(" ")
    escaped = "".join("\\" + c if c in SPECIAL else "?" if c in "\r\n" else c for c in kept)
    escaped += "\\ " * (len(bare) - len(kept))  # git drops trailing spaces not escaped
    return "/" + escaped + ("/" if folder else "")


def collisions(products: Iterable[str], tracked: Iterable[str]) -> list[str]:
    """The products in the way of a tracked path of another kind (a product folder where the
    commit has a file, a product file where it has a folder): removed before the commit is laid
    over them, since a file git tracks always wins."""
    files = set(tracked)
    folders = tracked_folders(files)
    found = []
    for product in products:
        bare = product.rstrip("/")
        if (product.endswith("/") and bare in files) or (
            not product.endswith("/") and bare in folders
        ):
            found.append(bare)
    return found

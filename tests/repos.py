"""Git for the tests' own set-up and checks, and the upstream repositories they work on.

The tests run git here, straight through `subprocess`, never through `orchestrator.core.git`: what a
test builds or checks must not depend on the code under test. `tests/conftest.py` hands these
out as the `git` and `make_upstream` fixtures.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

TEST_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}
"""Who the tests' own commits are by: someone other than Baton, so Baton's commits show."""


class Git:
    """Runs git for a test, as `TEST_IDENTITY`; a failing command fails the test."""

    def run(
        self,
        *args: str | Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        """`git *args` in `cwd`, with `env` added to this process's environment."""
        return subprocess.run(
            ["git", *map(str, args)],
            cwd=cwd,
            env={**os.environ, **TEST_IDENTITY, **(env or {})},
            check=check,
            capture_output=True,
        )

    def raw(
        self, *args: str | Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> bytes:
        """The stdout of a command that must succeed, byte for byte."""
        return self.run(*args, cwd=cwd, env=env).stdout

    def __call__(
        self, *args: str | Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        """The stdout of a command that must succeed, as text without surrounding whitespace."""
        return self.raw(*args, cwd=cwd, env=env).decode().strip()


class Upstream:
    """A user's repository: a bare `origin` (branch `main`) and a clone, `work`, that commits
    and pushes to it."""

    def __init__(self, git: Git, base: Path) -> None:
        self.git, self.base = git, base
        self.bare, self.work = base / "origin.git", base / "work"
        self.commits: list[str] = []
        """Every commit `commit` made, oldest first."""
        self.scratches = 0
        git("init", "--quiet", "--bare", "--initial-branch=main", self.bare)
        git("clone", "--quiet", self.bare, self.work)

    @property
    def pinned(self) -> str:
        """The oldest commit: runs are pinned to it, so work built on `main` instead shows."""
        return self.commits[0]

    def commit(self, files: Mapping[str, str | bytes], message: str = "change") -> str:
        """Write `files` (path: text or bytes), commit them and push to `main`; the new sha."""
        for name, data in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.encode() if isinstance(data, str) else data)
        self.git("add", "--all", cwd=self.work)
        self.git("commit", "--quiet", "-m", message, cwd=self.work)
        self.git("push", "--quiet", "origin", "HEAD:main", cwd=self.work)
        self.commits.append(self.git("rev-parse", "HEAD", cwd=self.work))
        return self.commits[-1]

    def diff(self, files: Mapping[str, bytes], base: str | None = None) -> bytes:
        """`git diff --binary` of a scratch clone at `base` (the pinned commit) after writing
        `files`: a change as a stage hands it on."""
        self.scratches += 1
        scratch = self.base / f"scratch-{self.scratches}"
        self.git("clone", "--quiet", self.bare, scratch)
        self.git("checkout", "--quiet", "--detach", base or self.pinned, cwd=scratch)
        for name, data in files.items():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / name).write_bytes(data)
        self.git("add", "--intent-to-add", "--all", cwd=scratch)
        return self.git.raw("diff", "--binary", "HEAD", cwd=scratch)

    def commits_on(self, branch: str) -> list[str]:
        """The commits of `branch` on the origin that the pinned commit does not have."""
        return self.git("rev-list", f"{self.pinned}..{branch}", cwd=self.bare).split()

    def branches(self) -> list[str]:
        """The origin's branches, as full ref names."""
        return self.git("for-each-ref", "--format=%(refname)", "refs/heads/", cwd=self.bare).split()


def tree(root: Path, files: Mapping[str, str]) -> Path:
    """`root` with `files` (path: text) written under it, folders made; `root`."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root

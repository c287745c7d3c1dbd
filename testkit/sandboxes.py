"""`Sandboxes` without Docker: each workspace a git working copy on this host, for tests.

`LocalSandboxes` is the in-process double of `workers.sandboxes.DockerSandboxes`: the stage
runner gets a `Workspace` from it through the same protocol, so a unit test runs the production
code path of a code stage with no daemon. Commands run on the host (`testkit.workspace`), not
contained: never give it a repository you would not run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testkit.workspace import LocalWorkspace
from workers.mirrors import RepoCache
from workers.sandboxes import WorkspaceRequest


class LocalSandboxes:
    """Working copies of the requested commit in temporary folders, removed afterwards; keeps
    what was asked of it (`requests`) and how many workspaces are open now (`open_now`)."""

    def __init__(self, cache_dir: Path) -> None:
        self.mirrors = RepoCache(cache_dir)
        self.requests: list[WorkspaceRequest] = []
        self.open_now = 0

    @contextmanager
    def open(self, request: WorkspaceRequest) -> Iterator[LocalWorkspace]:
        self.requests.append(request)
        with tempfile.TemporaryDirectory(prefix="baton-local-sandbox-") as tmp:
            dest = self.mirrors.checkout(request.repo, request.commit, Path(tmp) / "work")
            self.open_now += 1
            try:
                yield LocalWorkspace(dest)
            finally:
                self.open_now -= 1

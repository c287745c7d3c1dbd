"""The demo's pull request, for the reviewer's tool tests: its repository (made once a module),
the fake GitHub holding it (a fresh one a test), and the run a review stage would serve."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from demo.review import NAME, OWNER, ReviewRepo, make_review_repo, open_pull_request
from orchestrator.core.tools import ToolRun
from testkit.github import FakeGitHub

TOKEN = "ghp_test_0123456789abcdef"
"""The token the fake GitHub takes: it must show up nowhere but in the Authorization header."""
RUN_ID = "20261202-000000-abcdef"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> ReviewRepo:
    return make_review_repo(tmp_path_factory.mktemp("review") / "shopcart.git")


@pytest.fixture
def github(repo: ReviewRepo) -> Iterator[FakeGitHub]:
    with FakeGitHub.start(token=TOKEN, owner=OWNER, name=NAME) as fake:
        open_pull_request(fake, repo)
        yield fake


@pytest.fixture
def tool_run(repo: ReviewRepo) -> Callable[..., ToolRun]:
    """The run of the pull request `octo/shopcart#1` at its head, with fields replaced."""

    def make(**over: Any) -> ToolRun:
        values = {"run_id": RUN_ID, "pipeline": "reviewer", "stage": "review",
                  "repo": str(repo.path), "commit": repo.head, "base": repo.base,
                  "source": "pull_request", "source_id": f"{OWNER}/{NAME}#1", **over}  # fmt: skip
        return ToolRun.model_validate(values)

    return make

"""`baton demo-review`: the reviewer pipeline on a bundled pull request, on embedded defaults.

The pull request (demo/pull_request/) is a change to the demo's sample repository with a subtle
bug: a bulk discount whose threshold is off by one, which its own tests do not catch. The demo
makes the repository (`main`, and the branch `bulk-discount`), starts a private redis-server
unless `BATON_REDIS_URL` is set, the fake Gemini server playing the reviewer's scenario, the fake
GitHub holding the pull request, and one worker for the reviewer's stages (its GitHub token a
secret in the worker's environment only); enqueues the pull request's webhook payload; shows
progress; then shows the review the fake GitHub received, and stops everything it started.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from demo import HERE, SAMPLE_REPO
from demo.review_view import review_panel
from demo.runner import DemoResult, demo_settings, demo_summary
from orchestrator.control import api
from orchestrator.control.report import follow, published, run_table
from orchestrator.core.git import COMMITTER, git_output
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from orchestrator.pipelines.reviewer import SPEC
from testkit import services
from testkit.github import FakeGitHub
from testkit.pulls import pull_files
from testkit.services import worker_env

PULL_REQUEST = HERE / "pull_request"
"""The bundled pull request: the patches of `main` and of its branch, its webhook payload
(without the commits, which the demo adds) and the scenario the fake Gemini plays."""
SCENARIO = PULL_REQUEST / "scenario.json"
EVENT = PULL_REQUEST / "event.json"
OWNER, NAME = "octo", "shopcart"
"""The repository the fake GitHub serves: the event's `repository.full_name`."""
BASE, HEAD = "main", "bulk-discount"
TOKEN_VARIABLE = "BATON_GITHUB_TOKEN"
"""Where the worker reads the token the reviewer's host tool posts with (its declared secret)."""


@dataclass(frozen=True)
class ReviewRepo:
    """The bundled pull request's repository (a bare "remote") and its two commits."""

    path: Path
    base: str
    head: str


def make_review_repo(dest: Path) -> ReviewRepo:
    """A bare repository holding the sample package on `main` (its empty-cart bug fixed) and
    the branch `bulk-discount` one commit ahead of it."""
    work = dest.with_name(dest.name + "-work")
    shutil.copytree(SAMPLE_REPO, work, ignore=shutil.ignore_patterns("__pycache__"))

    def git(*args: str) -> str:
        return git_output(str(work), ["-C", str(work), *args], config=COMMITTER)

    git("init", "-q", "-b", BASE)
    git("add", "-A")
    git("commit", "-q", "-m", "shopcart: carts, items and the checkout summary")
    commits = {BASE: "cart: an empty cart's average price is 0",
               HEAD: "Bulk discount: 10% off carts of 10 units or more"}  # fmt: skip
    for branch, message in commits.items():
        if branch != BASE:
            git("checkout", "-q", "-b", branch)
        git("apply", str(PULL_REQUEST / f"{branch}.patch"))
        git("commit", "-q", "-a", "-m", message)
    repo = ReviewRepo(dest, base=git("rev-parse", BASE), head=git("rev-parse", HEAD))
    git_output(str(work), ["clone", "-q", "--bare", str(work), str(dest)])
    shutil.rmtree(work)
    return repo


def pull_request_event(repo: ReviewRepo) -> dict[str, Any]:
    """The bundled `pull_request` webhook payload, with the repository's commits in it."""
    event: dict[str, Any] = json.loads(EVENT.read_text())
    event["pull_request"]["head"]["sha"] = repo.head
    event["pull_request"]["base"]["sha"] = repo.base
    return event


def open_pull_request(github: FakeGitHub, repo: ReviewRepo) -> dict[str, Any]:
    """The bundled pull request on the fake GitHub, with its files as GitHub lists them."""
    pull = pull_request_event(repo)["pull_request"]
    return github.add_pull(
        HEAD, BASE, pull["title"], head_sha=repo.head, base_sha=repo.base, body=pull["body"],
        files=pull_files(repo.path, repo.base, repo.head),
    )  # fmt: skip


def run_review_demo(settings: Settings, *, timeout_s: float, console: Console) -> DemoResult:
    """Run the reviewer demo; the posted review is the result's `extra`."""
    if settings.redis_url:
        settings.redis_section()  # a URL Baton refuses stops the demo before anything starts
    token = f"ghp_demo_{secrets.token_hex(16)}"
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="baton-review-")))
        settings = demo_settings(settings, stack, work, console, SCENARIO)
        console.print(f"model: the fake Gemini server at {settings.gemini_base_url}, playing "
                      "the reviewer's scenario")  # fmt: skip
        github = stack.enter_context(FakeGitHub.start(token=token, owner=OWNER, name=NAME))
        repo = make_review_repo(work / "shopcart.git")
        pull = open_pull_request(github, repo)
        console.print(f"GitHub: the fake at {github.url}, with pull request "
                      f"{OWNER}/{NAME}#{pull['number']} ({HEAD} into {BASE})")  # fmt: skip
        queues = [stage.queue for stage in load_pipeline(str(SPEC)).stages]
        console.print(f"starting one worker for all stages ({', '.join(queues)})")
        env = {**worker_env(settings), TOKEN_VARIABLE: token, "BATON_GITHUB_API_URL": github.url}
        stack.enter_context(services.worker(env, queues, logfile=work / "worker.log"))
        run_id = api.enqueue(pull_request_event(repo), repo=str(repo.path), pipeline=str(SPEC),
                             settings=settings)  # fmt: skip
        console.print(f"enqueued the pull request as run {run_id}")
        run = follow(
            run_id, settings, interval_s=0.3, timeout_s=timeout_s, console=console, transient=True
        )
        store = RunStore.from_url(settings.redis_section())
        try:
            outputs = store.outputs(run_id, ["test", "review"])
        finally:
            store.redis.close()
        reviews = github.reviews[pull["number"]]
        summary = demo_summary(run, outputs)
        if isinstance(outputs.get("test"), dict):
            summary["stages"]["test"]["tests"] = outputs["test"].get("tests")
        summary["reviews"] = [_review_json(review) for review in reviews]
        where = published(run, outputs, load_pipeline(str(SPEC)))  # the review's page
        summary["published"] = where
        table = run_table(run, width=console.width, where=where)
        written = (outputs.get("review") or {}).get("comments") or []
        shown = review_panel(reviews[-1], written, pull) if reviews else None
        return DemoResult(summary=summary, table=table, extra=shown)
    raise AssertionError("unreachable")


def _review_json(review: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "state", "html_url", "commit_id", "body", "comments")
    return {key: review[key] for key in keep}

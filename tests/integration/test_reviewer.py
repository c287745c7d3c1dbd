"""The reviewer, end to end: the demo's pull request (a bulk discount off by one) runs to `done`
on a real Celery worker, its code stages in Docker sandboxes at the head, the fake Gemini
scripting every model call through the real client, and the fake GitHub receives one review
with the expected comments; the GitHub token shows up in no request, log, artifact or record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from demo.review import (
    NAME,
    OWNER,
    SCENARIO,
    ReviewRepo,
    make_review_repo,
    open_pull_request,
    pull_request_event,
)
from orchestrator.core.models import RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.store import RunStore
from orchestrator.pipelines.reviewer import SPEC
from testkit import services
from testkit.github import FakeGitHub
from testkit.services import worker_env
from tests.containers import sandboxes

from .conftest import Stack

TOKEN = "ghp_reviewer_5a1c0ffee0ddba11"


@dataclass
class Reviewer:
    repo: ReviewRepo
    github: FakeGitHub
    worker_log: Path


@pytest.fixture
def reviewer(stack: Stack, tmp_path: Path) -> Iterator[Reviewer]:
    """The demo's pull request on the fake GitHub, and a worker serving the reviewer's queues
    with the token in its environment (and every model request kept, to be searched); code
    stages in the plain sandbox image (no environment build)."""
    repo = make_review_repo(tmp_path / "shopcart.git")
    stack.fake.set_scenario(json.loads(SCENARIO.read_text()))
    log = tmp_path / "worker.log"
    with FakeGitHub.start(token=TOKEN, owner=OWNER, name=NAME) as github:
        open_pull_request(github, repo)
        env = {**worker_env(stack.settings), "BATON_GITHUB_TOKEN": TOKEN,
               "BATON_GITHUB_API_URL": github.url, "BATON_BUILD__ENABLED": "false",
               "BATON_KEEP_MODEL_REQUESTS": "true"}  # fmt: skip
        queues = [stage.queue for stage in load_pipeline(str(SPEC)).stages]
        with services.worker(env, queues, logfile=log, name="reviewer-worker"):
            yield Reviewer(repo, github, log)


def comments_of(scenario_review: dict[str, Any]) -> list[dict[str, Any]]:
    for step in scenario_review["steps"]:
        if "call" in step:
            found: list[dict[str, Any]] = step["call"]["args"]["comments"]
            return found
    raise AssertionError("the scenario's review posts no comments")


def test_the_reviewer_posts_one_review_of_the_pull_request_and_its_token_stays_out(
    stack: Stack, reviewer: Reviewer, run_store: RunStore
) -> None:
    repo, github = reviewer.repo, reviewer.github
    run_id = stack.enqueue(pull_request_event(repo), repo.path, pipeline=str(SPEC))
    run = stack.wait(run_id, timeout_s=120)

    assert run.status == RunStatus.DONE, run.reason
    assert (run.commit, run.base) == (repo.head, repo.base)
    [review] = github.reviews[1]
    assert (review["state"], review["commit_id"]) == ("COMMENTED", repo.head)
    written = comments_of(json.loads(SCENARIO.read_text())["agents"]["review"])
    high, medium, low = written  # the scenario's three, in order
    assert review["comments"] == [
        {"path": "shopcart/cart.py", "line": 39, "side": "RIGHT",
         "body": f"**high**: {high['text']}"},
        {"path": "shopcart/checkout.py", "line": 12, "side": "RIGHT",
         "body": f"**medium**: {medium['text']}"},
    ]  # fmt: skip
    assert (
        f"- `shopcart/cart.py:25` **low**: {low['text']} _(moved here: line 25 of "
        "shopcart/cart.py is not in the diff, which shows lines 2–11, 33–41 of it)_"
    ) in review["body"]
    assert review["body"].endswith(f"<!-- baton-review run={run.id} -->")
    output = run_store.output(run.id, "review")
    assert output is not None
    # the review's page, recorded from what post_review answered (never the model's word), is
    # where `status` says the result went
    assert (output["posted"], output["review_url"]) == (True, review["html_url"])
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "status", run.id, "--json"],
        env={**os.environ, "BATON_REDIS_URL": stack.settings.require_redis_url()},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["published"] == {
        "stage": "review", "url": review["html_url"], "branch": None, "commit": None,
    }  # fmt: skip

    # the stages read the change, worked at the head, and Baton measured the tests there
    [summarise] = stack.requests("summarise")
    instruction = json.dumps(summarise["request"]["systemInstruction"])
    assert json.dumps("+    def bulk_discount_cents(self) -> int:")[1:-1] in instruction
    audit = run_store.audit_log(run.id)
    results = [e["data"] for e in audit if e["kind"] == "tool_result" and e["stage"] == "inspect"]
    assert "if self.item_count() > BULK_UNITS:" in results[0]
    tests = (run_store.output(run.id, "test") or {})["tests"]
    assert (tests["exit_code"], tests["passed"], tests["failed"]) == (0, 6, 0)
    assert sandboxes(run.id) == []

    # the token went in GitHub's authorization header and nowhere else
    assert {entry["authorization"] for entry in github.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in json.dumps([{**e, "authorization": None} for e in github.requests])
    assert TOKEN not in json.dumps(stack.requests())
    assert TOKEN not in json.dumps(audit)
    refs = [ref for record in run.stages.values() for ref in record.artifacts.values()]
    assert any(ref.name.endswith("model-requests.jsonl") for ref in refs)
    assert all(TOKEN.encode() not in run_store.artifact(ref) for ref in refs)
    assert TOKEN not in run.model_dump_json()
    assert TOKEN not in json.dumps(run_store.outputs(run.id, list(run.stages)))
    assert TOKEN not in reviewer.worker_log.read_text()

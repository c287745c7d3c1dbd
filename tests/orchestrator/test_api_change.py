"""A run about a change: a pull request (or `--base`) pins a head and a base, a pipeline that
reviews a change (`{change}`) refuses a run without a base, and the same pull request pushed
again is another run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.control import api
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import ChangeRefs, Issue, IssueSource
from orchestrator.core.settings import Settings
from orchestrator.pipelines.reviewer import SPEC
from tests.repos import Upstream

ROOT = Path(__file__).resolve().parents[2]


def push_branch(upstream: Upstream, text: str) -> str:
    """Commit `text` as cart.py and push it as the origin's branch `discount`; its sha."""
    (upstream.work / "cart.py").write_text(text)
    upstream.git("commit", "--quiet", "-am", "discount", cwd=upstream.work)
    upstream.git("push", "--quiet", "--force", "origin", "HEAD:discount", cwd=upstream.work)
    upstream.commits.append(upstream.git("rev-parse", "HEAD", cwd=upstream.work))
    return upstream.commits[-1]


@pytest.fixture
def pull(make_upstream: Callable[[], Upstream]) -> Upstream:
    """`main` with one commit, and a branch `discount` one commit ahead of it on the origin."""
    made = make_upstream()
    made.commit({"cart.py": "def total(prices):\n    return sum(prices)\n"})
    push_branch(made, "def total(prices):\n    return sum(prices) * 9 // 10\n")
    return made


def pull_request(upstream: Upstream, **over: Any) -> dict[str, Any]:
    return {"repository": "acme/shop", "number": 7, "base": "main", "head": "discount",
            "title": "Discount", **over}  # fmt: skip


def test_a_pull_request_pins_its_head_as_the_commit_and_its_base(
    pull: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=unit_redis_url)

    run_id = api.enqueue(pull_request(pull), repo=str(pull.bare), pipeline=str(SPEC),
                         settings=settings)  # fmt: skip

    run = api.get_run(run_id, settings=settings)
    assert (run.commit, run.base) == (pull.commits[1], pull.commits[0])
    assert run.issue.change == ChangeRefs(base="main", head="discount")


def test_base_and_ref_pin_a_change_for_any_payload(
    pull: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=unit_redis_url)

    run_id = api.enqueue("Review the discount", repo=str(pull.bare), ref="discount", base="main",
                         pipeline=str(SPEC), settings=settings)  # fmt: skip

    run = api.get_run(run_id, settings=settings)
    assert (run.commit, run.base) == (pull.commits[1], pull.commits[0])


def test_the_same_pull_request_pushed_again_is_another_run(
    pull: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=unit_redis_url)
    submit = lambda: api.submit(pull_request(pull), repo=str(pull.bare), pipeline=str(SPEC),  # noqa: E731
                                settings=settings)  # fmt: skip

    first, again = submit(), submit()
    push_branch(pull, "def total(prices):\n    return sum(prices) * 90 // 100\n")
    pushed = submit()

    assert [created for _, created in (first, again, pushed)] == [True, False, True]
    assert again[0] == first[0]


def test_a_pipeline_that_reviews_a_change_refuses_a_run_without_a_base_and_writes_nothing(
    pull: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    with pytest.raises(IntakeError) as refused:
        api.enqueue("Review this", repo=str(pull.bare), pipeline=str(SPEC),
                    settings=Settings(redis_url=unit_redis_url))  # fmt: skip

    assert refused.value.field == "base"
    assert "pipeline 'reviewer' reviews a change ({change})" in refused.value.message
    assert "give --base" in refused.value.message
    assert redis_client.dbsize() == 0


def test_baton_enqueue_takes_a_base(
    pull: Upstream, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "enqueue", "--text",
         "Review the discount", "--repo",
         str(pull.bare), "--ref", "discount", "--base", "main", "--pipeline", str(SPEC)],
        env={**os.environ, "BATON_REDIS_URL": unit_redis_url, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    run = api.get_run(done.stdout.strip(), settings=Settings(redis_url=unit_redis_url))
    assert run.base == pull.commits[0]


PULL = Issue(source=IssueSource.PULL_REQUEST, title="t", change=ChangeRefs(base="main", head="x"))
REPORT = Issue(source=IssueSource.TEXT, title="t")


@pytest.mark.parametrize(
    ("issue", "ref", "base", "pinned"),
    [
        (PULL, None, None, ("x", "main")),
        (PULL, "x", "main", ("x", "main")),
        (REPORT, None, None, ("HEAD", None)),
        (REPORT, "feature", "main", ("feature", "main")),
    ],
)
def test_the_head_and_base_come_from_the_arguments_else_the_pull_request(
    issue: Issue, ref: str | None, base: str | None, pinned: tuple[str, str | None]
) -> None:
    assert api.change_refs(issue, ref, base) == pinned


@pytest.mark.parametrize(("ref", "base", "field"), [("y", None, "ref"), (None, "dev", "base")])
def test_a_ref_or_base_that_contradicts_the_pull_request_is_refused_naming_it(
    ref: str | None, base: str | None, field: str
) -> None:
    with pytest.raises(IntakeError) as refused:
        api.change_refs(PULL, ref, base)

    assert refused.value.field == field
    assert f"leave --{field} out (the pull request names it)" in refused.value.message

"""Intake of pull requests: GitHub's webhook payload, its REST object and a small JSON of one's
own each become an `Issue` carrying the change (base and head); bad ones are refused naming the
field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.control.intake import parse_payload
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import ChangeRefs, Issue, IssueSource

BASE_SHA = "a" * 40
HEAD_SHA = "b" * 40
PULL = {
    "url": "https://api.github.com/repos/acme/shop/pulls/42",
    "html_url": "https://github.com/acme/shop/pull/42",
    "number": 42,
    "state": "open",
    "draft": False,
    "title": "Round the bulk discount down",
    "body": "Rounds down.\n\nTests added.\n",
    "user": {"login": "ana"},
    "labels": [{"name": "discounts"}],
    "head": {"ref": "round-down", "sha": HEAD_SHA, "repo": {"full_name": "ana/shop"}},
    "base": {"ref": "main", "sha": BASE_SHA, "repo": {"full_name": "acme/shop"}},
}
EXPECTED = Issue(
    source=IssueSource.PULL_REQUEST,
    source_id="acme/shop#42",
    title="Round the bulk discount down",
    tags={
        "base": "main",
        "head": "round-down",
        "state": "open",
        "author": "ana",
        "label:discounts": "true",
    },
    links=["https://github.com/acme/shop/pull/42"],
    body="Rounds down.\n\nTests added.",
    change=ChangeRefs(base=BASE_SHA, head=HEAD_SHA),
)


def parse(payload: dict[str, Any], **kwargs: Any) -> Issue:
    return parse_payload(json.dumps(payload).encode(), **kwargs)


def test_a_pull_request_webhook_becomes_an_issue_with_its_change() -> None:
    webhook = {"action": "opened", "number": 42, "pull_request": PULL,
               "repository": {"full_name": "acme/shop"}}  # fmt: skip

    assert parse(webhook) == EXPECTED


def test_a_rest_pull_request_is_known_by_its_base_s_repository() -> None:
    assert parse(PULL) == EXPECTED


def test_a_small_json_names_refs_and_the_title_defaults_to_them() -> None:
    small = {"repository": "acme/shop", "number": 7, "base": "main", "head": "fix-rounding"}

    issue = parse(small)

    assert issue == Issue(
        source=IssueSource.PULL_REQUEST, source_id="acme/shop#7",
        title="Pull request #7: fix-rounding into main",
        tags={"base": "main", "head": "fix-rounding"},
        change=ChangeRefs(base="main", head="fix-rounding"),
    )  # fmt: skip
    assert issue.idempotency_key() == "pull_request:acme/shop#7"
    assert "Change: fix-rounding into main" in issue.digest()


def test_a_side_without_its_sha_pins_its_branch() -> None:
    pull = {**PULL, "head": {"ref": "round-down"}}

    assert parse(pull).change == ChangeRefs(base=BASE_SHA, head="round-down")


def test_without_a_repository_the_pull_request_has_no_source_id() -> None:
    pull = {"number": 3, "base": "main", "head": "x", "title": "A change"}

    assert parse(pull).source_id is None


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ({"action": "opened", "pull_request": {"title": "x", "base": "a", "head": "b"}},
         "pull_request.number", "needs its number"),
        ({"number": 1, "base": "main", "head": None}, "head", "needs its head"),
        ({"action": "opened", "pull_request": {**PULL, "base": {"label": "x"}}},
         "pull_request.base", "names neither a commit (sha) nor a branch (ref)"),
        ({"number": 1, "base": "main", "head": "--upload-pack=evil"}, "head",
         "no leading '-'"),
        ({"number": 1, "base": "main two", "head": "b"}, "base", "no spaces"),
        ({"number": 1, "base": 7, "head": "b"}, "base", "got a number"),
        ({"number": 1, "base": {"sha": "HEAD~1"}, "head": "b"}, "base.sha", "none of ~^:?*["),
        ({"number": 1, "base": "a", "head": "b", "repository": "not a repo"}, "repository",
         "expected owner/repo"),
        ({"action": "opened", "pull_request": PULL, "repository": {"full_name": "x"}},
         "repository.full_name", "expected owner/repo"),
    ],
)  # fmt: skip
def test_a_bad_pull_request_is_refused_naming_the_field(
    payload: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(IntakeError) as refused:
        parse(payload)

    assert refused.value.field == field
    assert words in refused.value.message


def test_an_issue_object_that_is_a_pull_request_points_at_the_pull_request_itself() -> None:
    as_issue = {"number": 5, "title": "Fix", "html_url": "https://github.com/a/b/pull/5"}

    with pytest.raises(IntakeError) as refused:
        parse(as_issue)

    assert "send the pull request itself" in refused.value.message
    assert "GET /repos/{owner}/{repo}/pulls/{number}" in refused.value.message

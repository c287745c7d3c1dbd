"""GitHub issues as `Issue`s: an issue object from the REST API or an `issues` webhook payload.

The source id is `owner/repo#number`, the repository taken from the webhook's
`repository.full_name`, else from the issue's `repository_url` or `html_url`; when none of them
names it the source id is left out, and the run is keyed by a hash of the issue instead.

Tags: `state` (open, closed), `author` (the opener's login) and one `label:<name>` = `"true"` per
label. An issue object that is a pull request (GitHub's issues API lists pull requests too,
without their base and head) is refused: an issue pipeline starts from an issue, and a pull
request is read from its own payload (`orchestrator.control.intake.pull`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.control.intake.fields import Node, at, clean, kind, nonblank, trim_lines
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import Issue, IssueSource

_NOT_AN_ISSUE = (
    "this is a GitHub pull request, not an issue: for an issue pipeline send an `issues` webhook "
    "payload or an issue object from the REST API; to review the pull request send the pull "
    "request itself (its `pull_request` webhook payload, or GET /repos/{owner}/{repo}/pulls/"
    "{number}), which has its base and head"
)
_PULL_URL = re.compile(r"/pull/\d+")
_FULL_NAME = re.compile(r"[\w.-]+/[\w.-]+")
_REPO_IN_API_URL = re.compile(r"/repos/([\w.-]+/[\w.-]+)/?$")
_REPO_IN_HTML_URL = re.compile(r"^https?://[^/]+/([\w.-]+/[\w.-]+)/(?:issues|pull)/\d+")


def parse_github(payload: Mapping[str, Any]) -> Issue:
    """An `Issue` from a GitHub issue object or an `issues` webhook payload."""
    root = Node(payload)
    issue = root.node("issue") or root
    if issue.find("pull_request") is not None:
        raise IntakeError(_NOT_AN_ISSUE, at(issue.path, "pull_request"))
    html_url = issue.link("html_url")
    if html_url and _PULL_URL.search(html_url):
        raise IntakeError(_NOT_AN_ISSUE, at(issue.path, "html_url"))
    title = nonblank(issue.text("title"))
    if title is None:
        raise IntakeError("a GitHub issue needs a title that is not blank", at(issue.path, "title"))
    number = issue.integer("number")
    if number is None:
        raise IntakeError("a GitHub issue needs its number", at(issue.path, "number"))
    repository = _repository(root.node("repository"), issue)
    return Issue(
        source=IssueSource.GITHUB,
        source_id=f"{repository}#{number}" if repository else None,
        title=title,
        tags=_tags(issue),
        links=[html_url] if html_url else [],
        body=trim_lines(issue.text("body")),
    )


def _repository(repository: Node | None, issue: Node) -> str | None:
    """`owner/repo`, from the webhook's repository object or the issue's own URLs."""
    full_name = repository.text("full_name") if repository else None
    if repository and full_name is not None:
        if not _FULL_NAME.fullmatch(full_name):
            raise IntakeError("expected owner/repo", at(repository.path, "full_name"))
        return full_name
    for key, pattern in (("repository_url", _REPO_IN_API_URL), ("html_url", _REPO_IN_HTML_URL)):
        match = pattern.search(issue.text(key) or "")
        if match:
            return match.group(1)
    return None


def _tags(issue: Node) -> dict[str, str]:
    tags: dict[str, str] = {}
    state = nonblank(issue.text("state"))
    author = nonblank((issue.node("user") or Node({})).text("login"))
    if state:
        tags["state"] = state
    if author:
        tags["author"] = author
    return {**tags, **label_tags(issue)}


def label_tags(issue: Node) -> dict[str, str]:
    """One `label:<name>` = `"true"` per label of an issue or a pull request."""
    tags: dict[str, str] = {}
    for path, label in issue.items("labels"):
        name = nonblank(_label_name(label, path))
        if name:
            tags[f"label:{name}"] = "true"
    return tags


def _label_name(label: Any, path: str) -> str | None:
    """A label is its name, or an object with a `name`."""
    if isinstance(label, str):
        return clean(label)
    if isinstance(label, dict):
        return Node(label, path).text("name")
    raise IntakeError(f"expected a label name or a label object, got {kind(label)}", path)

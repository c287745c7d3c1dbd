"""Pull requests as `Issue`s that carry a change: a GitHub pull request object from the REST
API, a `pull_request` webhook payload, or a small JSON of one's own:

    {"repository": "owner/repo", "number": 7, "base": "main", "head": "fix-rounding",
     "title": "Round discounts down", "body": "..."}

`base` and `head` are objects in GitHub's shapes (their `sha` is taken, else their `ref`) or
strings (a branch, a tag or a commit). Both are required, and so is the number; the repository
(`owner/repo`) comes from the webhook's `repository.full_name`, the small JSON's `repository`,
the base's `repo.full_name` or the pull request's URLs, and is left out when none names it. The
source id is `owner/repo#number`.

Tags: `base` and `head` (their branch names where GitHub gives them), `state`, `author` (the
opener's login), `draft` when it is one, and one `label:<name>` = `"true"` per label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.control.intake.fields import Node, at, kind, nonblank, trim_lines
from orchestrator.control.intake.github import label_tags
from orchestrator.core.errors import IntakeError
from orchestrator.core.models import ChangeRefs, Issue, IssueSource

_FULL_NAME = re.compile(r"[\w.-]+/[\w.-]+")
_REF = re.compile(r"[^\s~^:?*\[\\]{1,250}")
"""What git accepts as a ref or a commit, roughly: no spaces, no `~^:?*[\\`; nothing that
could be read as an option either (checked apart)."""
_REPO_IN_URL = re.compile(r"^https?://[^/]+/(?:repos/)?([\w.-]+/[\w.-]+)/pulls?/\d+/?$")
"""`https://github.com/owner/repo/pull/7` or `https://api.github.com/repos/owner/repo/pulls/7`."""


def looks_like_pull_request(payload: Mapping[str, Any]) -> bool:
    """A `pull_request` webhook payload, or an object naming a base and a head."""
    webhook = "action" in payload and isinstance(payload.get("pull_request"), dict)
    return webhook or {"base", "head"} <= payload.keys()


def parse_pull_request(payload: Mapping[str, Any]) -> Issue:
    """An `Issue` carrying the change (`Issue.change`) a pull request proposes."""
    root = Node(payload)
    pull = root.node("pull_request") or root
    number = pull.integer("number")
    if number is None:
        raise IntakeError("a pull request needs its number", at(pull.path, "number"))
    base, base_name = _side(pull, "base")
    head, head_name = _side(pull, "head")
    repository = _repository(root, pull)
    title = nonblank(pull.text("title")) or f"Pull request #{number}: {head_name} into {base_name}"
    html_url = pull.link("html_url")
    tags = {"base": base_name, "head": head_name, **_state_tags(pull), **label_tags(pull)}
    return Issue(
        source=IssueSource.PULL_REQUEST,
        source_id=f"{repository}#{number}" if repository else None,
        title=title,
        tags=tags,
        links=[html_url] if html_url else [],
        body=trim_lines(pull.text("body")),
        change=ChangeRefs(base=base, head=head),
    )


def _side(pull: Node, key: str) -> tuple[str, str]:
    """The commit (or ref) of the pull request's `base` or `head` to pin, and the name to show
    for it (its branch where there is one)."""
    path = at(pull.path, key)
    found = pull.find(key)
    if found is None:
        raise IntakeError(f"a pull request needs its {key}: a branch, a tag or a commit", path)
    value = found[1]
    if isinstance(value, str):
        return _ref(value, path), value.strip()
    if not isinstance(value, dict):
        raise IntakeError(f"expected a ref (a string) or an object with sha or ref, got "
                          f"{kind(value)}", path)  # fmt: skip
    side = Node(value, path)
    sha, ref = side.text("sha"), side.text("ref")
    if sha is None and ref is None:
        raise IntakeError(f"the {key} names neither a commit (sha) nor a branch (ref)", path)
    pinned = _ref(sha, at(path, "sha")) if sha is not None else _ref(ref or "", at(path, "ref"))
    return pinned, (ref or pinned).strip()


def _ref(value: str, path: str) -> str:
    ref = value.strip()
    if not _REF.fullmatch(ref) or ref.startswith("-"):
        raise IntakeError(
            "expected a branch, a tag or a commit (no spaces, no leading '-', none of ~^:?*[\\)",
            path,
        )
    return ref


def _repository(root: Node, pull: Node) -> str | None:
    """`owner/repo`, from the webhook's repository, the small JSON's, the base's, or a URL."""
    for holder, path in ((root, "repository"), (pull, "repository")):
        found = holder.find(path)
        if found is None:
            continue
        where, value = found
        name = value if isinstance(value, str) else Node.of(value, where).text("full_name")
        if name is not None:
            return _full_name(name, where if isinstance(value, str) else at(where, "full_name"))
    base = pull.node("base") if isinstance(pull.data.get("base"), dict) else None
    repo = base.node("repo") if base else None
    if repo is not None and repo.text("full_name") is not None:
        return _full_name(repo.text("full_name") or "", at(repo.path, "full_name"))
    for key in ("html_url", "url"):
        match = _REPO_IN_URL.match(pull.text(key) or "")
        if match:
            return match.group(1)
    return None


def _full_name(name: str, path: str) -> str:
    if not _FULL_NAME.fullmatch(name):
        raise IntakeError("expected owner/repo", path)
    return name


def _state_tags(pull: Node) -> dict[str, str]:
    tags: dict[str, str] = {}
    state = nonblank(pull.text("state"))
    author = nonblank((pull.node("user") or Node({})).text("login"))
    if state:
        tags["state"] = state
    if author:
        tags["author"] = author
    if pull.flag("draft"):
        tags["draft"] = "true"
    return tags

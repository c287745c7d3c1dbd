"""A pull request's changed files in the shape GitHub's `GET …/pulls/{number}/files` gives them,
made from a git repository, for the fake GitHub (`testkit.github.FakeGitHub.add_pull`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.core.git import git_output

STATUSES = {"A": "added", "M": "modified", "D": "removed", "R": "renamed", "C": "copied",
            "T": "changed"}  # fmt: skip


def pull_files(repo: Path, base: str, head: str) -> list[dict[str, Any]]:
    """Each file the change from `base` to `head` touches (from their merge base, as GitHub
    diffs a pull request): `filename`, `status`, `additions`, `deletions`, `changes` and
    `patch` (the file's diff from its first hunk on; none for a binary file)."""
    where = ["-C", str(repo)]
    span = f"{base}...{head}"
    names = git_output(str(repo), [*where, "diff", "--name-status", "-M", span]).splitlines()
    counts = git_output(str(repo), [*where, "diff", "--numstat", "-M", span]).splitlines()
    files = []
    for line, numbers in zip(names, counts, strict=True):
        status, *paths = line.split("\t")
        added, removed, _ = numbers.split("\t", 2)
        filename = paths[-1]
        item: dict[str, Any] = {"filename": filename, "status": STATUSES[status[0]]}
        if added != "-":  # numstat's mark of a binary file
            item.update(additions=int(added), deletions=int(removed),
                        changes=int(added) + int(removed))  # fmt: skip
            diff = git_output(str(repo), [*where, "diff", "-M", span, "--", *paths])
            item["patch"] = diff[diff.index("\n@@") + 1 :] if "\n@@" in diff else ""
        if len(paths) > 1:
            item["previous_filename"] = paths[0]
        files.append(item)
    return files

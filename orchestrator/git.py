"""Repositories: telling a URL from a path, running git safely, pinning a run's commit.

Both sides use this module: the orchestrator pins the commit when a run is enqueued, and the
workers' repository cache (`workers.mirrors`) clones and fetches through the same helpers.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.errors import RepoError

GIT_TIMEOUT_S = 60.0
"""Time limit of a git command that stays on this host."""
NETWORK_TIMEOUT_S = 900.0
"""Default time limit of a clone or fetch."""
MAX_GIT_MESSAGE_CHARS = 1_000
"""How much of git's stderr an error message quotes (the end, where git says what failed)."""
_FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
_SCP_LIKE = re.compile(r"[^/:]+:")  # `host:path` or `user@host:path`: git's rule for a URL


def git_env() -> dict[str, str]:
    """The whole environment of a git command: nothing from the caller but PATH and HOME.

    HOME stays, so git finds the user's own configuration (a credential helper for pushes);
    tokens and keys in the caller's environment never reach git or its hooks.
    """
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(Path.home()),
        "LANG": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
    }


def run_git(
    args: Sequence[str],
    *,
    timeout_s: float = GIT_TIMEOUT_S,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `git *args` without a shell; a failing command is returned, not raised.

    Raises `subprocess.TimeoutExpired` after `timeout_s` and `FileNotFoundError` without git.
    """
    return subprocess.run(
        ["git", *args],
        input=stdin,
        env={**git_env(), **(env or {})},
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def git_message(result: subprocess.CompletedProcess[str]) -> str:
    """What git said about a failure: the end of its stderr (or stdout), trimmed."""
    text = (result.stderr or result.stdout or "").strip() or f"exit code {result.returncode}"
    return text[-MAX_GIT_MESSAGE_CHARS:]


def is_url(repo: str) -> bool:
    """True for a URL (`https://…`, `file://…`, `git@host:path`), False for a local path."""
    return "://" in repo or bool(_SCP_LIKE.match(repo))


def resolve_commit(repo: str, ref: str = "HEAD", *, timeout_s: float = NETWORK_TIMEOUT_S) -> str:
    """The full sha of `ref` in `repo`, a local path (`rev-parse`) or a URL (`ls-remote`)."""
    source = repo_source(repo)
    if is_url(source):
        return _resolve_remote(source, ref, timeout_s)
    rev_parse = ["-C", source, "rev-parse", "--verify", f"{ref}^{{commit}}"]
    return git_for(source, rev_parse, timeout_s, failed=f"{ref!r} names no commit in {source}")


def repo_source(repo: str) -> str:
    """`repo` as git should see it: URLs unchanged, local paths absolute."""
    if not repo.strip():
        raise RepoError("the repository is empty; give a local path or a git URL")
    if is_url(repo):
        return repo
    return str(Path(repo).expanduser().resolve())


def _resolve_remote(url: str, ref: str, timeout_s: float) -> str:
    if _FULL_SHA.fullmatch(ref):
        return ref.lower()  # ls-remote lists refs, not commits; a full sha is its own answer
    refs: dict[str, str] = {}
    for line in git_for(url, ["ls-remote", url, ref], timeout_s).splitlines():
        sha, _, name = line.partition("\t")
        refs[name] = sha
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"):
        if name in refs:
            return refs[name]
    raise RepoError(f"{ref!r} names no branch, tag or ref in {redact(url)}")


def git_for(source: str, args: list[str], timeout_s: float, *, failed: str = "") -> str:
    """Run git for `source`; its stdout, or a `RepoError` naming the repository and git's words.

    `failed` replaces the start of the message, "git <command> of <repository> failed".
    """
    what = args[2] if args[0] == "-C" else args[0]
    try:
        result = run_git(args, timeout_s=timeout_s)
    except FileNotFoundError as exc:
        raise RepoError("git is not installed (or not on PATH); install git") from exc
    except subprocess.TimeoutExpired as exc:
        raise RepoError(f"git {what} of {redact(source)} took over {timeout_s:g} s") from exc
    if result.returncode != 0:
        failed = failed or f"git {what} of {redact(source)} failed"
        raise RepoError(f"{failed}: {redact(git_message(result))}")
    return result.stdout.strip()


def redact(text: str) -> str:
    """Hide credentials written into URLs (`https://user:token@host/…`)."""
    return re.sub(r"://[^/@\s]+@", "://***@", text)

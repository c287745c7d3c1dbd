"""Naming a repository and pinning the commit a run works on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.errors import RepoError

GIT_TIMEOUT_S = 120


def git_env() -> dict[str, str]:
    """A minimal environment for git: no credentials or API keys of the caller leak into it."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
    }


def git(*args: str, cwd: Path | None = None, timeout_s: float = GIT_TIMEOUT_S) -> str:
    """Run git; its stdout, stripped.

    Raises:
        RepoError: git failed or timed out; the message carries git's own words.
    """
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RepoError(f"git {args[0]} timed out after {timeout_s:.0f}s") from exc
    if done.returncode != 0:
        raise RepoError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[-800:]}")
    return done.stdout.strip()


def normalize(repo: str) -> str:
    """An absolute path for a local repository; URLs unchanged."""
    if "://" in repo or (":" in repo and not Path(repo).exists()):
        return repo
    return str(Path(repo).expanduser().resolve())


def resolve_commit(repo: str, ref: str = "HEAD") -> str:
    """The full sha `ref` names in `repo` (a local path or any git URL).

    Raises:
        RepoError: the repository or the ref cannot be read.
    """
    path = Path(repo)
    if path.exists():
        if not (path / ".git").exists() and not (path / "HEAD").exists():
            raise RepoError(f"{repo} is not a git repository")
        return git("rev-parse", "--verify", f"{ref}^{{commit}}", cwd=path)
    listing = git("ls-remote", repo, ref)
    if not listing:
        raise RepoError(f"{repo} has no ref {ref!r}")
    return listing.split()[0]

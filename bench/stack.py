"""What the benchmarks that run Baton for real set up alike: a repository and settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from orchestrator.git import COMMITTER, git_output
from orchestrator.settings import Settings

API_KEY = "bench-key"
"""The fake server's key: no benchmark needs a real one."""


def empty_repo(path: Path) -> Path:
    """A git repository at `path` with one empty commit, for runs that never read it."""
    path.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "empty"]):
        git_output(str(path), ["-C", str(path), *args], config=COMMITTER)
    return path


def bench_settings(redis_url: str, fake_url: str, work: Path) -> Settings:
    """Baton's settings for a fleet on `redis_url` and the fake server at `fake_url`."""
    return Settings(
        redis_url=redis_url,
        gemini_base_url=fake_url,
        google_api_key=SecretStr(API_KEY),
        repo_cache_dir=work / "cache",
    )

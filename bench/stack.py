"""What the benchmarks that run Baton for real set up alike: a repository, settings, and a
fleet of workers started and stopped together."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

from pydantic import SecretStr

from orchestrator.core.git import COMMITTER, git_output
from orchestrator.core.settings import Settings

T = TypeVar("T")

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


@contextmanager
def together(managers: Sequence[AbstractContextManager[T]]) -> Iterator[list[T]]:
    """Enter the context managers at once (each in a thread), and exit them at once: a fleet
    of workers starts and stops in the time of one."""
    if not managers:
        yield []
        return
    with ThreadPoolExecutor(max_workers=len(managers)) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
        wait(futures)
    entered = [m for m, f in zip(managers, futures, strict=True) if f.exception() is None]
    try:
        yield [future.result() for future in futures]
    finally:
        if entered:
            with ThreadPoolExecutor(max_workers=len(entered)) as pool:
                list(pool.map(lambda m: m.__exit__(None, None, None), entered))

"""Shared fixtures: a real redis-server for the whole session, a clean database per test; git
for the tests' own set-up and checks, and upstream repositories made to order."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest
import redis

from orchestrator.store import RunStore
from testkit import services
from tests.repos import Git, Upstream


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with services.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def unit_redis_url(redis_url: str) -> str:
    """Database 1 of the same server: unit tests flush it freely, while integration tests and
    their workers use database 0, which is never flushed (Celery keeps its bindings there)."""
    return redis_url.rsplit("/", 1)[0] + "/1"


@pytest.fixture
def redis_client(unit_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(unit_redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis) -> RunStore:
    return RunStore(redis_client, ttl_s=3600)


@pytest.fixture(scope="session")
def git() -> Git:
    """Git for a test's own set-up and checks (`git(...)` text, `git.raw(...)` bytes), never
    through the code under test."""
    return Git()


@pytest.fixture
def make_upstream(
    git: Git, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Upstream]]:
    """Makes empty upstream repositories (a bare origin and a clone); removed after the test."""
    made: list[Upstream] = []

    def make() -> Upstream:
        made.append(Upstream(git, tmp_path_factory.mktemp("upstream")))
        return made[-1]

    yield make
    for upstream in made:
        shutil.rmtree(upstream.base, ignore_errors=True)

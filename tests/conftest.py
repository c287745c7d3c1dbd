"""Shared fixtures: a real redis-server for the whole session, a clean database per test; git
for the tests' own set-up and checks, and upstream repositories made to order. And the two
tiers.

A test belongs to the integration tier (marker `integration`) when it lives in a folder that
runs real services (`tests/integration`, `tests/deploy`, `tests/sandbox`), when it asks for a
fixture that starts one (`SERVICE_FIXTURES`), or when its module says so (`pytestmark`). The
rest is the unit tier, `make unit`: no redis-server, no dockerd, no network.

The service fixtures import what they need (redis, `testkit.services`, the run store) when first
used: pytest's main process imports this module too, and under xdist it only hands tests to its
workers; google-adk, Celery and redis would cost it two seconds before the first worker starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import tiers  # noqa: F401  (registers the `unit` Hypothesis profile)
from tests.repos import Git, Upstream

if TYPE_CHECKING:
    import redis

    from orchestrator.core.store import RunStore
    from tests.twin import Names

TESTS = Path(__file__).resolve().parent
SERVICE_FOLDERS = frozenset({"integration", "deploy"})
"""Folders whose tests run real services: redis-server, Celery workers, dockerd, Chromium."""
SERVICE_FIXTURES = frozenset(
    {"redis_url", "unit_redis_url", "redis_client", "store", "docker_client"}
)
"""Fixtures that start or need a service (a redis-server for the session, dockerd)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        if folder in SERVICE_FOLDERS or SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from testkit import services

    with services.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def unit_redis_url(redis_url: str) -> str:
    """Database 1 of the same server: unit tests flush it freely, while integration tests and
    their workers use database 0, which is never flushed (Celery keeps its bindings there)."""
    return redis_url.rsplit("/", 1)[0] + "/1"


@pytest.fixture
def redis_client(unit_redis_url: str) -> Iterator[redis.Redis]:
    import redis

    client = redis.Redis.from_url(unit_redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis) -> RunStore:
    from orchestrator.core.store import RunStore

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


@pytest.fixture(scope="session")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Names:
    """The fixer's renamed twin (`tests/twin.py`): its spec and schemas module written once a
    session, the module importable from then on."""
    from tests.twin import twin as make_twin

    return make_twin(tmp_path_factory.mktemp("twin"))


@pytest.fixture(params=["fixer", "twin"])
def names(request: pytest.FixtureRequest) -> Names:
    """The fixer, then its renamed twin: a test that asks for it runs over both, reading and
    writing outputs through it in the fixer's names."""
    from tests.twin import fixer

    return fixer() if request.param == "fixer" else request.getfixturevalue("twin")

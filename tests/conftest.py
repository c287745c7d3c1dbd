"""Shared fixtures: a real redis-server for the whole session, a clean database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from orchestrator.demo import services
from orchestrator.store import RunStore


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with services.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis) -> RunStore:
    return RunStore(redis_client, ttl_s=3600)

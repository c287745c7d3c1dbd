"""The fleet's environments (`workers.environments`), against real Redis, dockerd and git: one
build per key, a cache hit without a build, a rebuild when a dependency file changes and none
when another file does, and a failure recorded so that no other worker builds it again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
import redis

import workers.environments as environments_module
from sandbox.build import EnvironmentBuildError
from sandbox.errors import SandboxUnavailableError
from tests.repos import Upstream
from workers.builder import BuildRequest
from workers.environments import Environments
from workers.mirrors import RepoCache

APP = "def add(a, b):\n    return a + b\n"
TESTS = "from app import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"


@pytest.fixture
def environments(
    redis_client: redis.Redis, docker_client: docker.DockerClient, tmp_path: Path
) -> Iterator[Environments]:
    made = Environments(redis_client, RepoCache(tmp_path / "mirrors"), docker_client=docker_client)
    yield made
    for key in made.keys():
        tag = (made.record(key) or {}).get("tag")
        if tag and tag.startswith("baton-env:"):
            try:
                docker_client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tags `build_environment` was asked to build, in order."""
    asked: list[str] = []
    real = environments_module.build_environment

    def counting(*args: object, **kwargs: object) -> object:
        asked.append(str(kwargs["tag"]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(environments_module, "build_environment", counting)
    return asked


def project(make_upstream: Callable[[], Upstream]) -> tuple[Upstream, str]:
    upstream = make_upstream()
    commit = upstream.commit(
        {
            "requirements.txt": "iniconfig==2.0.0\n",
            "app.py": APP,
            "test_app.py": TESTS,
            "README.md": "one\n",
        }
    )
    return upstream, commit


def test_an_environment_is_built_once_and_then_found_in_under_a_second(
    environments: Environments, builds: list[str], make_upstream: Callable[[], Upstream]
) -> None:
    upstream, commit = project(make_upstream)

    first = environments.prepare(str(upstream.bare), commit)
    started = time.monotonic()
    again = environments.prepare(str(upstream.bare), commit)
    lookup_s = time.monotonic() - started

    assert (first.built, again.built) == (True, False)
    assert first.key == again.key and builds == [first.tag]
    assert first.baseline.passed == ["test_app.py::test_add"] == again.baseline.passed
    assert lookup_s < 1.0
    record = environments.record(first.key) or {}
    assert (record["status"], record["passed"], record["failed"]) == ("ok", "1", "0")


def test_a_dependency_change_rebuilds_and_any_other_change_does_not(
    environments: Environments, builds: list[str], make_upstream: Callable[[], Upstream]
) -> None:
    upstream, commit = project(make_upstream)
    first = environments.prepare(str(upstream.bare), commit)

    readme = upstream.commit({"README.md": "two\n", "app.py": APP + "\n# changed\n"})
    after_readme = environments.prepare(str(upstream.bare), readme)
    requirements = upstream.commit({"requirements.txt": "iniconfig==2.0.0\nsix==1.16.0\n"})
    after_requirements = environments.prepare(str(upstream.bare), requirements)

    assert after_readme.key == first.key and not after_readme.built
    assert after_requirements.key != first.key and after_requirements.built
    assert builds == [first.tag, after_requirements.tag]


def test_workers_needing_the_same_environment_at_once_build_it_once(
    environments: Environments,
    builds: list[str],
    make_upstream: Callable[[], Upstream],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    upstream, commit = project(make_upstream)
    others = [Environments(redis_client, RepoCache(tmp_path / f"mirrors-{n}")) for n in range(2)]
    found: list[str] = []

    def prepare(envs: Environments) -> None:
        found.append(envs.prepare(str(upstream.bare), commit).key)

    threads = [threading.Thread(target=prepare, args=(e,)) for e in [environments, *others]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)

    assert len(found) == 3 and len(set(found)) == 1
    assert len(builds) == 1


def test_a_failed_build_is_recorded_and_not_built_again_by_the_next_worker(
    environments: Environments, builds: list[str], make_upstream: Callable[[], Upstream]
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"requirements.txt": "no-such-package-for-baton==9.9\n"})

    with pytest.raises(EnvironmentBuildError, match=r"pip install -r requirements\.txt") as first:
        environments.prepare(str(upstream.bare), commit)
    with pytest.raises(EnvironmentBuildError) as second:
        environments.prepare(str(upstream.bare), commit)

    assert str(second.value) == str(first.value)
    assert len(builds) == 1


def test_a_worker_that_may_not_build_hands_the_build_over_and_finds_what_the_builder_built(
    environments: Environments,
    redis_client: redis.Redis,
    docker_client: docker.DockerClient,
    builds: list[str],
    tmp_path: Path,
    make_upstream: Callable[[], Upstream],
) -> None:
    """The builder runs in a thread here; tests/integration/test_builder.py runs the real
    `baton worker --builder` behind the sandbox gate's build socket."""
    upstream, commit = project(make_upstream)
    handed: list[BuildRequest] = []

    def builder(request: BuildRequest, client: docker.DockerClient) -> None:
        handed.append(request)
        threading.Thread(
            target=environments.prepare, args=(request.repo, request.commit), daemon=True
        ).start()

    worker = Environments(
        redis_client, RepoCache(tmp_path / "worker-mirrors"), docker_client=docker_client,
        handoff=builder,
    )  # fmt: skip

    found = worker.prepare(str(upstream.bare), commit)

    assert [(r.repo, r.commit, r.spec, r.key) for r in handed] == [
        (str(upstream.bare), commit, None, found.key)
    ]
    assert not found.built and builds == [found.tag]  # built once, by the builder
    assert found.baseline.passed == ["test_app.py::test_add"]


def test_a_failure_the_builder_records_is_raised_in_the_waiting_worker(
    redis_client: redis.Redis,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    make_upstream: Callable[[], Upstream],
) -> None:
    upstream, commit = project(make_upstream)
    builder = Environments(redis_client, RepoCache(tmp_path / "b"), docker_client=docker_client)

    def failing(request: BuildRequest, client: docker.DockerClient) -> None:
        builder.record_failure(request.key, request.repo, "the daemon went away", retryable=True)

    def refusing(request: BuildRequest, client: docker.DockerClient) -> None:
        builder.record_failure(request.key, request.repo, "ValueError: bad spec", retryable=False)

    worker = Environments(
        redis_client, RepoCache(tmp_path / "w"), docker_client=docker_client, handoff=failing
    )
    with pytest.raises(SandboxUnavailableError, match="the daemon went away"):
        worker.prepare(str(upstream.bare), commit)

    redis_client.flushdb()
    worker.handoff = refusing
    with pytest.raises(EnvironmentBuildError, match="bad spec"):
        worker.prepare(str(upstream.bare), commit)


def test_a_build_no_builder_takes_fails_retryably_naming_the_builder(
    redis_client: redis.Redis,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_upstream: Callable[[], Upstream],
) -> None:
    upstream, commit = project(make_upstream)
    monkeypatch.setattr(environments_module, "BUILDER_START_S", 1.0)
    monkeypatch.setattr(environments_module, "HANDOFF_POLL_S", 0.1)
    worker = Environments(
        redis_client, RepoCache(tmp_path / "w"), docker_client=docker_client,
        handoff=lambda request, client: None,
    )  # fmt: skip

    with pytest.raises(SandboxUnavailableError, match=r"baton worker --builder"):
        worker.prepare(str(upstream.bare), commit)

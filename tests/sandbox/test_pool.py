"""The warm pool against the real dockerd: ready containers, one per execution, refilled in the
background, expired when idle, known to the reaper and found by their execution's labels."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import docker
import pytest

from sandbox import SandboxConfig, remove_labelled
from sandbox import labels as label
from sandbox.pool import POOL_LABEL, WarmPool

CFG = SandboxConfig(memory_mb=128)


def until(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f}s")
        time.sleep(0.05)


def pooled(client: docker.DockerClient) -> list[str]:
    found = client.api.containers(all=True, filters={"label": f"{POOL_LABEL}=1"})
    return sorted(c["Id"] for c in found)


@pytest.fixture
def pool(docker_client: docker.DockerClient) -> Iterator[WarmPool]:
    made = WarmPool(size=2, idle_s=600, client=docker_client)
    yield made
    made.close()
    until(lambda: pooled(docker_client) == [], "the pool's containers were not removed")


def test_a_sandbox_taken_from_the_pool_was_started_before_and_is_never_used_twice(
    pool: WarmPool, docker_client: docker.DockerClient
) -> None:
    with pool.start(CFG, labels={}, env={}) as cold:  # the first ask: nothing ready yet
        assert cold.exec(["true"]).exit_code == 0
    until(lambda: pool.ready() == 2, "the pool did not fill")
    waiting = pooled(docker_client)

    started = time.monotonic()
    with pool.start(CFG, labels={}, env={}) as first:
        took_s = time.monotonic() - started
        assert first.id in waiting
        assert first.exec(["id", "-u"]).output.strip() == "1000"
    with pool.start(CFG, labels={}, env={}) as second:
        assert second.id != first.id

    assert took_s < 0.05
    assert first.id not in pooled(docker_client) and second.id not in pooled(docker_client)
    until(lambda: pool.ready() == 2, "the pool did not refill")


def test_pooled_containers_carry_what_the_reaper_reads_and_a_full_ttl(
    pool: WarmPool, docker_client: docker.DockerClient
) -> None:
    with pool.start(CFG, labels={}, env={"SHOP": "1"}):
        pass
    until(lambda: pool.ready() == 2, "the pool did not fill")

    for container_id in pooled(docker_client):
        labels = docker_client.api.inspect_container(container_id)["Config"]["Labels"]
        assert labels[label.SANDBOX] == "1"
        assert labels[label.OWNER] == label.owner()
        assert float(labels[label.EXPIRES]) >= time.time() + CFG.ttl_s


def test_an_executions_labels_find_its_pooled_sandbox_for_removal(
    pool: WarmPool, docker_client: docker.DockerClient
) -> None:
    with pool.start(CFG, labels={}, env={}):
        pass
    until(lambda: pool.ready() == 2, "the pool did not fill")

    with pool.start(CFG, labels={"baton.run": "r-pool", "baton.stage": "fix"}, env={}) as box:
        removed = remove_labelled({"baton.run": "r-pool", "baton.stage": "fix"})
        assert removed == [box.id]
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(box.id)
    assert remove_labelled({"baton.run": "r-pool"}) == []


def test_idle_containers_expire_and_unused_configurations_are_not_refilled(
    docker_client: docker.DockerClient,
) -> None:
    pool = WarmPool(size=1, max_configs=1, idle_s=2, client=docker_client)
    try:
        with pool.start(CFG, labels={}, env={}):
            pass
        until(lambda: pool.ready() == 1, "the pool did not fill")
        first = pooled(docker_client)
        until(lambda: pooled(docker_client) not in ([], first), "an idle container lived on", 20)

        other = CFG.model_copy(update={"memory_mb": 256})
        with pool.start(other, labels={}, env={}):  # the first configuration is no longer wanted
            pass
        until(lambda: pool.ready() == 1, "the pool did not fill for the new configuration")
        memory = {
            docker_client.api.inspect_container(c)["HostConfig"]["Memory"]
            for c in pooled(docker_client)
        }
        assert memory == {256 * 2**20}
    finally:
        pool.close()

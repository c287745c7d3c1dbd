"""The warm pool against the real dockerd: ready containers, one per execution, refilled in the
background, expired when idle, known to the reaper, and named for the execution that took them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from sandbox import SandboxConfig, remove_labelled
from sandbox import labels as label
from sandbox.pool import POOL_LABEL, WarmPool

CFG = SandboxConfig(memory_mb=128)
ROOT = Path(__file__).resolve().parents[2]
REMOVE = (
    "import json, sys; from sandbox import remove_labelled\n"
    "print(*remove_labelled(json.loads(sys.argv[1])))"
)


def until(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f}s")
        time.sleep(0.05)


def pooled(client: docker.DockerClient) -> list[str]:
    """This process's pooled containers (a worker another test killed may have left its own
    for the reaper)."""
    mine = [f"{POOL_LABEL}=1", f"{label.OWNER}={label.owner()}"]
    found = client.api.containers(all=True, filters={"label": mine})
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

    # Taken, not started: its id is one of the containers that waited (how much time that
    # saves is bench/sandbox.py's to measure, not a timed test's on a busy machine).
    with pool.start(CFG, labels={}, env={}) as first:
        assert first.id in waiting
        assert first.exec(["id", "-u"]).output.strip() == "1000"
    with pool.start(CFG, labels={}, env={}) as second:
        assert second.id != first.id

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


def test_a_taken_sandbox_is_named_for_its_execution_and_found_by_it_from_another_process(
    pool: WarmPool, docker_client: docker.DockerClient
) -> None:
    with pool.start(CFG, labels={}, env={}):
        pass
    until(lambda: pool.ready() == 2, "the pool did not fill")
    waiting = pooled(docker_client)
    execution = {"baton.run": "r-pool", "baton.stage": "fix", "baton.attempt": "2"}

    with pool.start(CFG, labels=execution, env={}) as box:
        name = docker_client.api.inspect_container(box.id)["Name"]
        listed = subprocess.run(
            ["docker", "ps", "-q", "--no-trunc", "--filter", "name=r-pool.fix"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        removed = subprocess.run(  # a process other than the pool's, as `baton cancel` is
            [sys.executable, "-c", REMOVE, json.dumps({"baton.run": "r-pool"})],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.split()  # fmt: skip
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(box.id)

    assert box.id in waiting
    assert re.fullmatch(r"/baton-sbx-r-pool\.fix\.2-[0-9a-f]{12}", name)
    assert listed == [box.id]
    assert removed == [box.id]
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

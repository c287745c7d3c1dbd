"""Builds behind the sandbox gate, as Compose and Kubernetes run them: a code-stage worker holds
only the gate's ordinary socket, which refuses to create a build container; it hands its build
to `baton worker --builder`, a real Celery worker process holding the gate's build socket, which
builds under gVisor with no network but the egress proxy's socket, and records the environment
the worker then uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import docker
import pytest
import redis

from orchestrator.core.queue import celery_app
from orchestrator.core.settings import QueueConfig
from sandbox import SandboxStartError
from sandbox.build import BuildSettings, build_environment, environment_tag
from sandbox.environment import EnvironmentSpec
from testkit import services
from testkit.projects import tree_tar
from tests.repos import Upstream
from workers.builder import BuildHandoff
from workers.environments import Environments
from workers.mirrors import RepoCache

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@pytest.mark.timeout(600)
def test_a_worker_hands_its_build_to_the_builder_behind_the_gate_s_build_socket(
    redis_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    make_upstream: Callable[[], Upstream],
) -> None:
    egress, gate = tmp_path / "egress", tmp_path / "gate"
    egress.mkdir(mode=0o755)
    gate.mkdir()
    upstream = make_upstream()
    commit = upstream.commit(
        {
            "requirements.txt": "iniconfig==2.0.0\n",
            "app.py": "def add(a, b):\n    return a + b\n",
            "test_app.py": "from app import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        }
    )
    options = ("--runtime", "runsc", "--allow-ca-bundle", CA_BUNDLE,
               "--allow-egress-source", str(egress))  # fmt: skip
    with services.sandbox_gate(gate, *options, build_socket=True) as listen:
        worker_docker = docker.DockerClient(base_url=f"unix://{listen}")
        # The worker's own socket cannot make a build container, whatever it labels it.
        with pytest.raises(SandboxStartError, match="build socket"):
            build_environment(
                EnvironmentSpec(setup=("true",)), tree_tar(egress),
                tag=environment_tag("refused"), settings=BuildSettings(egress_dir=egress),
                client=worker_docker,
            )  # fmt: skip

        env = {
            "BATON_REDIS_URL": redis_url,
            "DOCKER_HOST": f"unix://{listen.parent / services.BUILD_SOCKET}",
            "BATON_SANDBOX__RUNTIME": "runsc",
            "BATON_BUILD__EGRESS_DIR": str(egress),
            "BATON_REPO_CACHE_DIR": str(tmp_path / "builder-mirrors"),
        }
        app = celery_app("test-worker", redis_url, QueueConfig())
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        worker = Environments(
            client, RepoCache(tmp_path / "worker-mirrors"), BuildSettings(handoff=True),
            docker_client=worker_docker, handoff=BuildHandoff(app),
        )  # fmt: skip
        with services.builder(env, logfile=tmp_path / "builder.log"):
            found = worker.prepare(str(upstream.bare), commit)
        try:
            assert found.baseline.passed == ["test_app.py::test_add"]
            image = docker_client.api.inspect_image(found.tag)
            assert image["Config"]["User"] == "1000:1000"
            log = (tmp_path / "builder.log").read_text()
            assert f"environment {found.key}" in log  # the builder built it
            gate_log = (gate / "gate.log").read_text()
            assert "POST /containers/create" in gate_log  # the refusal above, and only it
            assert gate_log.count("refused") == 1
        finally:
            docker_client.api.remove_image(found.tag, force=True)
            client.close()
            worker_docker.close()

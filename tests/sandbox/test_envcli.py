"""`baton env build`, `ls`, `prune` and `shell` against real Redis, dockerd and git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import docker
import redis
from click.testing import CliRunner

from tests.repos import Upstream
from workers.envcli import env

ROOT = Path(__file__).resolve().parents[2]
TESTS = "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"


def test_build_then_ls_then_prune(
    make_upstream: Callable[[], Upstream],
    unit_redis_url: str,
    redis_client: redis.Redis,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    upstream = make_upstream()
    commit = upstream.commit({"tests/__init__.py": "", "tests/test_ok.py": TESTS})
    runner = CliRunner()
    settings = {"BATON_REDIS_URL": unit_redis_url, "BATON_REPO_CACHE_DIR": str(tmp_path / "c")}

    built = runner.invoke(env, ["build", str(upstream.bare), "--json"], env=settings)
    again = runner.invoke(env, ["build", str(upstream.bare), "--json"], env=settings)
    listed = runner.invoke(env, ["ls", "--json"], env=settings)
    table = runner.invoke(env, ["ls"], env=settings, terminal_width=80)
    dry = runner.invoke(env, ["prune", "--older-than", "0", "--dry-run"], env=settings)
    pruned = runner.invoke(env, ["prune", "--older-than", "0"], env=settings)

    first, second = json.loads(built.stdout), json.loads(again.stdout)
    assert (first["built"], second["built"]) == (True, False), built.output
    assert first["key"] == second["key"] and first["commit"] == commit
    assert (first["passed"], first["failed"]) == (1, 0)
    records = json.loads(listed.stdout)
    assert [(r["key"], r["status"], r["passed"]) for r in records] == [(first["key"], "ok", "1")]
    assert first["key"] in table.stdout  # the key is never cut, even at 80 columns
    assert dry.stdout.splitlines()[0] == f"would remove {first['key']}"
    assert pruned.stdout.splitlines()[0] == f"removed {first['key']}"
    assert redis_client.keys("baton:env:*") == []
    assert docker_client.images.get("baton-sandbox:2")  # the base image is never pruned


def test_shell_is_a_stages_sandbox_with_the_tree_and_no_network(
    make_upstream: Callable[[], Upstream],
    unit_redis_url: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    upstream = make_upstream()
    upstream.commit({"tests/__init__.py": "", "tests/test_ok.py": TESTS, "NOTES": "kept\n"})
    typed = (
        "id -u\n"
        "cat NOTES\n"
        "grep CapEff /proc/self/status\n"
        "touch /etc/x 2>/dev/null || echo read-only root\n"
        "python3 -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), 2)' 2>&1"
        " | tail -n 1\n"
        "exit 3\n"
    )
    settings = {"BATON_REDIS_URL": unit_redis_url, "BATON_REPO_CACHE_DIR": str(tmp_path / "c")}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "env", "shell", str(upstream.bare)],
        input=typed, capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, **settings},
    )  # fmt: skip

    lines = done.stdout.splitlines()
    assert done.returncode == 3, done.stderr
    assert lines[:4] == ["1000", "kept", "CapEff:\t0000000000000000", "read-only root"]
    assert "Network is unreachable" in lines[4]
    assert "exit to leave" in done.stderr
    left = docker_client.api.containers(all=True, filters={"label": "baton.shell"})
    assert left == []

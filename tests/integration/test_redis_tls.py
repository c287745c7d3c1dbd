"""`rediss://` for real: a redis-server that speaks TLS only, with a CA the test makes and
Baton's Redis users. `baton demo` runs the whole fixer pipeline over it as the user `worker`
(its store, its Celery broker, the quota governor, its worker subprocess); a client without the
CA, or one that names the server by a name its certificate does not carry, is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.core.connection import checked_config
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from testkit import services
from testkit.services import RedisServer, RedisUsers
from testkit.tls import make_tls_files

K8S_BATON = Path(__file__).resolve().parents[2] / "k8s" / "baton"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """TLS only (no plain port), on localhost; the certificate names `localhost` alone."""
    folder = tmp_path_factory.mktemp("tls")
    users = RedisUsers.generated(
        K8S_BATON / "redis-users.acl", K8S_BATON / "redis-users.sh", ("worker",)
    )
    tls = make_tls_files(folder / "ca", hosts=("localhost",))
    with services.redis_service(folder / "redis", users=users, tls=tls) as server:
        yield server


@pytest.mark.timeout(420)
def test_the_demo_runs_to_the_end_over_tls_as_the_worker_user(
    tls_redis: RedisServer, tmp_path: Path
) -> None:
    assert tls_redis.tls is not None
    url = tls_redis.url("worker")
    assert url.startswith("rediss://worker:")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "GOOGLE_"))},
        "BATON_REDIS_URL": url,
        "BATON_REDIS_CA_FILE": str(tls_redis.tls.ca_file),
        "HOME": str(tmp_path),
    }
    demo = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "demo", "--json", "--timeout", "240"],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    summary = json.loads(demo.stdout)
    assert summary["status"] == "done", summary
    assert {stage["status"] for stage in summary["stages"].values()} == {"done"}
    assert "private redis-server" not in demo.stderr  # it used this one
    admin = tls_redis.client(decode_responses=True)
    try:
        assert admin.hget(f"baton:run:{summary['run_id']}", "status") == "done"
        assert admin.acl_log() == []  # nothing the worker user did was refused
    finally:
        admin.close()


def test_a_client_without_the_ca_is_refused(tls_redis: RedisServer) -> None:
    config = checked_config(tls_redis.url("worker"))  # the system's CAs only
    client = redis.Redis.from_url(config.url, **config.client_options())
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            client.ping()
    finally:
        client.close()
    dispatcher = Dispatcher.connect(config, QueueConfig())
    try:
        with dispatcher.app.connection_for_write() as connection:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                connection.connect()
    finally:
        dispatcher.close()


def test_a_name_the_certificate_does_not_carry_is_refused(tls_redis: RedisServer) -> None:
    assert tls_redis.tls is not None
    url = tls_redis.url("worker").replace("@localhost:", "@127.0.0.1:")
    config = checked_config(url, tls_redis.tls.ca_file)
    client = redis.Redis.from_url(config.url, **config.client_options())
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="IP address mismatch"):
            client.ping()
    finally:
        client.close()


def test_the_server_speaks_tls_only(tls_redis: RedisServer) -> None:
    plain = redis.Redis.from_url(tls_redis.url("worker").replace("rediss://", "redis://"))
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            plain.ping()
    finally:
        plain.close()
    trusted = tls_redis.client("worker")
    try:
        assert trusted.ping() is True
    finally:
        trusted.close()

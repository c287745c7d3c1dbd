"""Baton's Redis users for real: a redis-server started from the ACL Baton ships
(k8s/baton/redis-users.acl), through the script Compose and Kubernetes run (redis-users.sh).

Each role is refused what it does not need — the dangerous commands, other roles' keys, the
broadcast that controls workers — and, over TLS with the server's certificate checked, each
does its real work: a worker runs the demo's Sentry event to the end, enqueued and watched by
the operator's `cli` user (`baton top`, `baton reconcile`), `baton serve` reads, cancels and
resumes runs and keeps its sessions, Flower shows the workers, the tasks and the queues, KEDA
reads the queues' lengths. Redis's ACL LOG, which records every refusal, stays empty."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from pydantic import SecretStr

from demo import SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.core import keys
from orchestrator.core.models import RunStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import RedisServer, RedisUsers, worker_env
from testkit.tls import make_tls_files
from workers import environments

from .conftest import CANARY_KEY, demo_scenario

K8S_BATON = Path(__file__).resolve().parents[2] / "k8s" / "baton"
ACL_FILE, USERS_SCRIPT = K8S_BATON / "redis-users.acl", K8S_BATON / "redis-users.sh"
ROLES = ("worker", "serve", "flower", "cli", "keda")
QUEUE = "baton.fixer.triage"

DANGEROUS = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "requirepass"),
    ("CONFIG", "SET", "appendonly", "no"),
    ("KEYS", "*"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "intruder", "on", ">0123456789abcdef", "+@all", "~*"),
    ("INFO",),
    ("MONITOR",),
    ("CLIENT", "LIST"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("SHUTDOWN", "NOSAVE"),
    ("SCRIPT", "FLUSH"),
    ("FUNCTION", "FLUSH"),
    ("BGSAVE",),
    ("REPLICAOF", "NO", "ONE"),
    ("SWAPDB", "0", "1"),
    ("EVAL", "return 1", "0"),
    ("SORT", QUEUE),
]
"""Commands no role of Baton needs: what would wipe, reconfigure, stop, list or watch Redis.
(DEBUG and MODULE are off for everyone, Redis's default, before any ACL is asked.)"""

NOT_THEIRS = {
    "worker": [
        ("GET", "baton:serve:session:0f"),  # a login session of `baton serve`
        ("SET", "baton:serve:session:0f", "forged"),
        ("ZADD", "baton:serve:failures:user:0f", "1", "x"),
    ],
    "serve": [
        ("BRPOP", QUEUE, "1"),  # take a stage off its queue
        ("DEL", QUEUE),
        ("HGETALL", "unacked"),
        ("SET", "unacked_mutex", "x"),
        ("ZADD", "baton:quota:gemini", "1", "x"),
        ("HGETALL", "baton:env:0f"),
        ("SET", "baton:lock:reconciler", "x"),
        ("SET", "baton:run:1:artifact:x", "forged"),  # SET is for its own keys only
        ("DEL", "baton:run:1"),
        ("PUBLISH", "/0.celery.pidbox", "shutdown"),  # the broadcast that controls workers
    ],
    "flower": [
        ("HGETALL", "baton:run:1"),
        ("GET", "baton:run:1:artifact:x"),
        ("LPUSH", QUEUE, "forged"),
        ("DEL", QUEUE),
        ("BRPOP", QUEUE, "1"),
        ("HGETALL", "unacked"),
        ("GET", "baton:serve:session:0f"),
        ("PUBLISH", "/0.celeryev/task.sent", "forged"),
    ],
    "cli": [
        ("GET", "baton:serve:session:0f"),
        ("DEL", QUEUE),
        ("BRPOP", QUEUE, "1"),
        ("HSET", "unacked", "x", "y"),
        ("SET", "unacked_mutex", "x"),
        ("ZADD", "baton:quota:gemini", "1", "x"),
        ("SET", "baton:lock:reconciler", "x"),
        ("HGETALL", "baton:env:0f"),
    ],
    "keda": [
        ("LRANGE", QUEUE, "0", "-1"),
        ("LLEN", "baton:run:1"),
        ("GET", "baton:run:1"),
        ("DEL", QUEUE),
        ("SUBSCRIBE", "/0.celeryev/task.sent"),
    ],
}
"""What each role must not do though another role may: keys and channels not its own."""


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server with Baton's users, each with a new password."""
    users = RedisUsers.generated(ACL_FILE, USERS_SCRIPT, ROLES)
    with services.redis_service(tmp_path_factory.mktemp("acl-redis"), users=users) as server:
        yield server


def refused(client: redis.Redis, *command: str) -> bool:
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    return False


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_run_a_dangerous_command(role: str, acl_redis: RedisServer) -> None:
    client = acl_redis.client(role)
    admin = acl_redis.client()
    try:
        allowed = [" ".join(command) for command in DANGEROUS if not refused(client, *command)]
        assert allowed == []
        assert admin.ping() is True  # still up, nothing flushed or reconfigured
    finally:
        client.close()
        admin.close()


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_touch_what_is_another_roles(role: str, acl_redis: RedisServer) -> None:
    client = acl_redis.client(role)
    try:
        allowed = [
            " ".join(command) for command in NOT_THEIRS[role] if not refused(client, *command)
        ]
        assert allowed == []
    finally:
        client.close()


def baton_keys() -> dict[str, list[str]]:
    """A key of each kind Baton names (orchestrator/core/keys.py, workers/environments.py), by the
    part of Baton that uses it."""
    run = "20261201-000000-abcdef"
    return {
        "runs": [keys.run(run), keys.outputs(run), keys.artifact(run, "fix/workspace.diff"),
                 keys.audit(run), keys.idempotency("sentry:1|repo|fixer"), keys.ACTIVE,
                 keys.kept_child(run, "sub_x")],
        "run list": [keys.RUNS],
        "workers": [keys.RECONCILER_LOCK, keys.quota("gemini"), keys.cooldown("gemini"),
                    keys.quota_scale("gemini"), f"{environments.RECORD_PREFIX}0f",
                    f"{environments.LOCK_PREFIX}0f", f"{environments.KEY_OF_PREFIX}0f:c0:-",
                    keys.kept_child_claim(run, "sub_x")],
        "serve": [f"{keys.PREFIX}serve:session:0f", f"{keys.PREFIX}serve:failures:user:0f"],
        "consumers": [keys.consumers("baton.fixer.fix")],
    }  # fmt: skip


def test_each_role_reaches_the_keys_of_its_work_and_no_others(acl_redis: RedisServer) -> None:
    """Asked of Redis without running anything (ACL DRYRUN): EXPIRE needs write access to a
    key, EXISTS read access."""
    admin = acl_redis.client(decode_responses=True)

    def may(user: str, *command: str) -> bool:
        return bool(admin.acl_dryrun(user, *command) == "OK")

    try:
        found = baton_keys()
        for key in [key for kind in ("runs", "run list", "workers") for key in found[kind]]:
            assert may("worker", "EXPIRE", key, "1"), key
        for user in ("serve", "cli"):
            assert all(may(user, "EXPIRE", key, "1") for key in found["runs"]), user
            assert may(user, "EXISTS", *found["run list"]), user
            assert not any(may(user, "EXISTS", key) for key in found["workers"]), user
        for key in found["consumers"]:  # workers announce the queues they serve; others read
            assert may("worker", "ZADD", key, "1", "w"), key
            assert all(may(user, "ZCOUNT", key, "0", "+inf") for user in ("serve", "cli")), key
            assert not any(may(user, "ZADD", key, "1", "w") for user in ("serve", "cli")), key
        for key in found["serve"]:
            assert may("serve", "DEL", key), key
            assert not may("serve", "EXPIRE", key, "1")  # its own commands only, there
        for user in ("worker", "cli", "flower", "keda"):
            assert not any(may(user, "EXISTS", key) for key in found["serve"]), user
        for user in ("flower", "keda"):
            everything = [key for kind in ("runs", "run list", "workers") for key in found[kind]]
            assert not any(may(user, "LLEN", key) for key in everything), user
    finally:
        admin.close()


def test_a_worker_may_keep_a_child_and_claim_it_and_nobody_else_may_claim(
    acl_redis: RedisServer,
) -> None:
    """The commands of `orchestrator.core.children.ChildStore`, asked by ACL DRYRUN (the
    release script's GET and DEL are checked as the commands themselves)."""
    admin = acl_redis.client(decode_responses=True)
    run = "20261201-000000-abcdef"
    claim, kept = keys.kept_child_claim(run, "sub_x"), keys.kept_child(run, "sub_x")
    commands = [
        ("SET", claim, "holder", "NX", "EX", "600"), ("GET", claim), ("DEL", claim),
        ("EVALSHA", "0" * 40, "1", claim, "holder"), ("GET", kept), ("SET", kept, "{}"),
    ]  # fmt: skip
    try:
        assert [c for c in commands if admin.acl_dryrun("worker", *c) != "OK"] == []
        for user in ("serve", "cli", "flower", "keda"):
            assert admin.acl_dryrun(user, *commands[0]) != "OK", user
    finally:
        admin.close()


def test_nobody_logs_in_without_a_password_or_with_a_wrong_one(acl_redis: RedisServer) -> None:
    for url in (
        f"redis://{acl_redis.host}:{acl_redis.port}/0",
        f"redis://worker:{'0' * 32}@{acl_redis.host}:{acl_redis.port}/0",
        f"redis://:{'0' * 32}@{acl_redis.host}:{acl_redis.port}/0",
    ):
        client = redis.Redis.from_url(url)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                client.ping()
        finally:
            client.close()


# -- the real work, over TLS --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server that speaks TLS only, with Baton's users; its CA is the test's own."""
    folder = tmp_path_factory.mktemp("tls-redis")
    users = RedisUsers.generated(ACL_FILE, USERS_SCRIPT, ROLES)
    tls = make_tls_files(folder / "tls", hosts=("localhost",))
    with services.redis_service(folder / "redis", users=users, tls=tls) as server:
        yield server


def acl_log(server: RedisServer) -> list[dict[str, object]]:
    admin = server.client(decode_responses=True)
    try:
        return [
            {k: entry[k] for k in ("username", "reason", "object", "context")}
            for entry in admin.acl_log(count=100)
        ]
    finally:
        admin.close()


def role_env(server: RedisServer, role: str) -> dict[str, str]:
    assert server.tls is not None
    return {"BATON_REDIS_URL": server.url(role), "BATON_REDIS_CA_FILE": str(server.tls.ca_file)}


def baton(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def wait_until_done(run_id: str, settings: Settings, timeout_s: float = 150.0) -> RunStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = api.get_run(run_id, settings=settings).status
        if status.is_terminal or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


@pytest.mark.timeout(420)
def test_each_role_does_its_work_over_tls_and_is_refused_nothing(
    tls_redis: RedisServer, tmp_path: Path
) -> None:
    assert acl_log(tls_redis) == []
    with FakeGemini.start(demo_scenario(), record_path=tmp_path / "requests.jsonl") as fake:
        worker_settings = Settings(
            redis_url=tls_redis.url("worker"),
            redis_ca_file=tls_redis.tls.ca_file if tls_redis.tls else None,
            gemini_base_url=fake.url,
            google_api_key=SecretStr(CANARY_KEY),
            repo_cache_dir=tmp_path / "repo-cache",
        )
        cli = worker_settings.model_copy(update={"redis_url": tls_redis.url("cli")})
        queues = [stage.queue for stage in load_pipeline("fixer").stages]
        with services.worker(worker_env(worker_settings), queues, logfile=tmp_path / "worker.log",
                             mingle=True):  # fmt: skip
            # `baton flower` first: it shows only tasks sent after it subscribed.
            with flower(tls_redis, tmp_path / "flower.log") as (flower_url, login):
                repo = make_sample_repo(tmp_path / "shopcart.git")
                run_id = api.enqueue(SENTRY_EVENT.read_bytes(), repo=str(repo), settings=cli)
                assert wait_until_done(run_id, cli) is RunStatus.DONE
                check_flower(flower_url, login, run_id)
            check_cli(tls_redis, run_id)
            check_serve(tls_redis, cli, repo, tmp_path / "serve.log", run_id)
    check_keda(tls_redis)
    assert acl_log(tls_redis) == []


@contextlib.contextmanager
def flower(server: RedisServer, logfile: Path) -> Iterator[tuple[str, tuple[str, str]]]:
    """`baton flower` as the user `flower`, once it sees a worker's heartbeat."""
    port, login = services.free_port(), ("operator", secrets.token_hex(16))
    env = {**os.environ, **role_env(server, "flower"), "BATON_FLOWER_USER": login[0],
           "BATON_FLOWER_PASSWORD": login[1]}  # fmt: skip
    argv = [sys.executable, "-m", "orchestrator.control.cli", "flower", "--port", str(port),
            "--address", "127.0.0.1"]  # fmt: skip
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, logfile.read_text(errors="replace")[-2000:]
            try:
                workers = httpx.get(f"{url}/api/workers", auth=login, timeout=5).json()
            except (httpx.TransportError, ValueError):
                workers = {}
            if workers:
                break
            assert time.monotonic() < deadline, "Flower saw no worker"
            time.sleep(0.5)
        yield url, login
    finally:
        services.stop(proc)


def check_flower(url: str, login: tuple[str, str], run_id: str) -> None:
    """The tasks (from the events), the workers' queues (from an inspection) and the queues'
    lengths (its broker page, read from Redis)."""
    stages = {stage.name for stage in load_pipeline("fixer").stages}
    deadline, shown = time.monotonic() + 30, {}
    while time.monotonic() < deadline and len(shown) < len(stages):
        found = httpx.get(f"{url}/api/tasks", params={"search": run_id}, auth=login, timeout=10)
        shown = {task["name"] for task in found.json().values()}
        time.sleep(0.5)
    assert shown == {f"baton.fixer.{stage}" for stage in stages}
    lengths = httpx.get(f"{url}/api/queues/length", auth=login, timeout=10).json()
    assert {q["name"] for q in lengths["active_queues"]} >= {QUEUE}
    broker = httpx.get(f"{url}/broker", auth=login, timeout=10)
    assert broker.status_code == 200 and QUEUE in broker.text


def check_cli(server: RedisServer, run_id: str) -> None:
    """The operator's commands as the user `cli`: the fleet (a broadcast to the workers and the
    queues), a run's status, a sweep for stuck runs."""
    env = role_env(server, "cli")
    top = baton("top", "--json", env=env)
    assert top.returncode == 0, top.stderr
    assert len(json.loads(top.stdout)["workers"]) == 1
    status = baton("status", run_id, "--json", env=env)
    assert json.loads(status.stdout)["status"] == "done"
    reconciled = baton("reconcile", env=env)
    assert (reconciled.returncode, reconciled.stdout.strip()) == (0, "no stuck runs")


def check_serve(
    server: RedisServer, cli: Settings, repo: Path, logfile: Path, done_run: str
) -> None:
    """`baton serve` as the user `serve`: reads a run and its audit log, cancels a run and
    resumes it (which sends its stage again); and the commands its sessions and login
    counters take, on its own keys."""
    token = secrets.token_hex(16)
    env = {
        **role_env(server, "serve"),
        "BATON_SERVE_TOKENS": json.dumps({"ci": f"control:{token}"}),
    }
    headers = {"Authorization": f"Bearer {token}"}
    with services.serve(server.url("serve"), env, logfile=logfile) as url:
        run = httpx.get(f"{url}/api/v1/runs/{done_run}", headers=headers, timeout=10)
        assert run.status_code == 200 and run.json()["summary"]["status"] == "done"
        listed = httpx.get(f"{url}/api/v1/runs", headers=headers, timeout=10)
        assert done_run in {r["run_id"] for r in listed.json()["runs"]}
        other = api.enqueue(SENTRY_EVENT.read_bytes(), repo=str(repo), settings=cli, force=True)
        cancelled = httpx.post(f"{url}/api/v1/runs/{other}/cancel", headers=headers, timeout=10)
        assert cancelled.json()["status"] == "cancelled"
        deadline = time.monotonic() + 60  # a running stage stops at its next safe point
        while True:
            resumed = httpx.post(f"{url}/api/v1/runs/{other}/resume", headers=headers, timeout=10)
            if resumed.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert resumed.status_code == 200, resumed.text
        assert wait_until_done(other, cli) is RunStatus.DONE  # its stage was sent again
    sessions = server.client("serve")
    try:
        session, failures = f"{keys.PREFIX}serve:session:0f", f"{keys.PREFIX}serve:failures:x"
        assert sessions.set(session, "{}", px=60_000) and sessions.get(session) == b"{}"
        with sessions.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(failures, "-inf", 0).zadd(failures, {"a": 1.0})
            pipe.zrange(failures, 0, -1, withscores=True).pexpire(failures, 60_000)
            assert pipe.execute()[2] == [(b"a", 1.0)]
        assert sessions.zrem(failures, "a") == 1 and sessions.delete(session) == 1
    finally:
        sessions.close()


def check_keda(server: RedisServer) -> None:
    keda = server.client("keda")
    try:
        assert keda.ping() is True
        assert keda.llen(QUEUE) == 0
    finally:
        keda.close()

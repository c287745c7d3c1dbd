"""The processes a local Baton needs, as context managers that stop what they started:
a private redis-server, the fake Gemini server, Celery workers, `baton serve` and the sandbox
gate.

The demo, the tests and the benchmarks all start their services through this module; Baton
itself never does (in production, Redis and the workers are the operator's).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from testkit.tls import TlsFiles
from workers.cli import APP, worker_argv

STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RedisUsers:
    """The users a redis-server starts with: Baton's ACL (`acl_file`), turned into
    configuration by the script that does it in Compose and Kubernetes (`script`), with a
    password per user (`default` is Redis's admin)."""

    acl_file: Path
    script: Path
    passwords: Mapping[str, str]

    @classmethod
    def generated(cls, acl_file: Path, script: Path, users: Sequence[str]) -> RedisUsers:
        """`users` and the admin, each with a new random password."""
        names = dict.fromkeys(["default", *users])
        return cls(acl_file, script, {user: secrets.token_hex(16) for user in names})

    def environment(self) -> dict[str, str]:
        """The script's variables: `BATON_REDIS_<USER>_PASSWORD`, the admin's
        `BATON_REDIS_PASSWORD`."""
        return {
            "BATON_REDIS_PASSWORD" if user == "default" else f"BATON_REDIS_{user.upper()}_PASSWORD":
            password
            for user, password in self.passwords.items()
        }  # fmt: skip

    def configuration(self) -> str:
        """The `user` lines of redis.conf, as the script prints them."""
        done = subprocess.run(
            ["sh", str(self.script), str(self.acl_file)], env={"PATH": os.defpath,
            **self.environment()}, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ConfigError(f"{self.script.name} refused the users: {done.stderr.strip()}")
        return done.stdout


@dataclass(frozen=True)
class RedisServer:
    """A redis-server this module started: where it listens, and how to log in."""

    host: str
    port: int
    tls: TlsFiles | None = None
    users: RedisUsers | None = None

    def url(self, user: str | None = None, *, db: int = 0) -> str:
        """The URL of database `db`, as `user` (with its password) if given."""
        scheme = "rediss" if self.tls else "redis"
        login = ""
        if user is not None:
            assert self.users is not None, "this server has no users"
            login = f"{user}:{self.users.passwords[user]}@"
        return f"{scheme}://{login}{self.host}:{self.port}/{db}"

    def client(self, user: str | None = "default", **options: Any) -> redis.Redis:
        """A redis-py client of database 0 as `user` (the admin unless told otherwise), trusting
        the server's CA."""
        if self.tls:
            options["ssl_ca_certs"] = str(self.tls.ca_file)
        return redis.Redis.from_url(self.url(user if self.users else None), **options)


@contextmanager
def redis_server(workdir: Path, *, port: int | None = None) -> Iterator[str]:
    """A private redis-server with AOF on and `noeviction`; yields its URL."""
    with redis_service(workdir, port=port) as server:
        yield server.url()


@contextmanager
def redis_service(
    workdir: Path,
    *,
    port: int | None = None,
    users: RedisUsers | None = None,
    tls: TlsFiles | None = None,
) -> Iterator[RedisServer]:
    """A private redis-server with AOF on and `noeviction`, and with `users` only these users
    (their configuration on stdin, as in Compose and Kubernetes); with `tls`, it speaks TLS
    only, on a port of localhost. Yields where it is."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigError(
            "redis-server is not installed: run `make setup` or apt-get install redis-server"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        binary,
        "-",
        "--port",
        "0" if tls else str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--maxmemory-policy",
        "noeviction",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]
    if tls:
        argv += ["--tls-port", str(port), "--tls-cert-file", str(tls.cert_file),
                 "--tls-key-file", str(tls.key_file), "--tls-ca-cert-file", str(tls.ca_file),
                 "--tls-auth-clients", "no"]  # fmt: skip
    configuration = users.configuration() if users else ""
    with open(workdir / "redis.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    assert proc.stdin is not None
    proc.stdin.write(configuration.encode())
    proc.stdin.close()
    server = RedisServer("localhost" if tls else "127.0.0.1", port, tls, users)
    try:
        _wait_for_redis(server, proc)
        yield server
    finally:
        stop(proc)


def _wait_for_redis(
    server: RedisServer, proc: subprocess.Popen[bytes], timeout_s: float = 15.0
) -> None:
    client = server.client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"redis-server exited at start with code {proc.returncode}")
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
        finally:
            client.close()
    raise ConfigError(f"redis-server did not answer on port {server.port} within {timeout_s:.0f}s")


@contextmanager
def fake_gemini(scenario: Path, *, record: Path | None = None, port: int = 0) -> Iterator[str]:
    """The fake Gemini server in a subprocess; yields its base URL."""
    argv = [
        sys.executable,
        "-m",
        "testkit.gemini",
        "--scenario",
        str(scenario),
        "--port",
        str(port),
    ]
    if record:
        argv += ["--record", str(record)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("fake-gemini listening on "):
            raise ConfigError(f"fake Gemini server did not start (exit code {proc.poll()})")
        yield line.removeprefix("fake-gemini listening on ")
    finally:
        stop(proc)


@contextmanager
def worker(
    env: Mapping[str, str],
    queues: Sequence[str],
    *,
    concurrency: int = 1,
    logfile: Path,
    name: str = "baton-worker",
    app: str = APP,
    options: Sequence[str] = (),
    mingle: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """A Celery worker subprocess serving `queues`, with more worker `options` if given;
    stopped with a warm shutdown. Without `mingle` it starts faster: no mingle and no gossip,
    which `baton worker` has (a worker asks the others for their state, and watches them)."""
    argv = worker_argv(queues, concurrency=concurrency, name=f"{name}-{free_port()}", app=app)
    argv += [*([] if mingle else ["--without-gossip", "--without-mingle"]), *options]
    with _celery_worker(argv, env, logfile, "the worker") as proc:
        yield proc


@contextmanager
def serve(
    redis_url: str, env: Mapping[str, str], *, logfile: Path, options: Sequence[str] = ()
) -> Iterator[str]:
    """`baton serve` in a subprocess on a free port of 127.0.0.1, with `env` (its logins and
    tokens) added to this one's; yields its base URL once /api/v1/health answers."""
    port = free_port()
    argv = [sys.executable, "-m", "orchestrator.control.cli", "serve", "--port", str(port),
            "--address", "127.0.0.1", *options]  # fmt: skip
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as log:
        proc = subprocess.Popen(
            argv, env={**os.environ, "BATON_REDIS_URL": redis_url, **env}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/api/v1/health", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _wait_until(healthy, proc, logfile, "baton serve", timeout_s=30.0)
        yield url
    finally:
        stop(proc)


@contextmanager
def builder(env: Mapping[str, str], *, logfile: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`baton worker --builder` as an operator runs it (its queue from the daemon `DOCKER_HOST`
    in `env` reaches); stopped with a warm shutdown."""
    argv = [sys.executable, "-m", "orchestrator.control.cli", "worker", "--builder"]
    with _celery_worker(argv, env, logfile, "the builder") as proc:
        yield proc


@contextmanager
def _celery_worker(
    argv: Sequence[str], env: Mapping[str, str], logfile: Path, what: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` (a Celery worker) with `env` added, once it says it is ready; stopped after."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as log:
        # Its own session: a test can kill the worker and its pool processes as one group.
        proc = subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until(
            lambda: "ready." in logfile.read_text(errors="replace"), proc, logfile, what,
            timeout_s=60.0,
        )  # fmt: skip
        yield proc
    finally:
        stop(proc)


BUILD_SOCKET = "build.sock"
"""The name of the build socket `sandbox_gate(..., build_socket=True)` opens in its folder."""


@contextmanager
def sandbox_gate(
    folder: Path, *options: str, docker_url: str | None = None, build_socket: bool = False
) -> Iterator[Path]:
    """`baton sandbox-gate` with `options` in front of dockerd (`DOCKER_HOST`, else the usual
    socket), listening on `folder`/docker.sock, which it yields once it exists (and, with
    `build_socket`, on the build socket `folder`/build.sock too); its log is `folder`/gate.log."""
    listen, logfile = folder / "docker.sock", folder / "gate.log"
    upstream = docker_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    sockets = [listen, *([folder / BUILD_SOCKET] if build_socket else [])]
    argv = [sys.executable, "-m", "orchestrator.control.cli", "sandbox-gate",
            "--listen", str(listen), "--docker", upstream, *options]  # fmt: skip
    if build_socket:
        argv += ["--build-listen", str(sockets[1])]
    with open(logfile, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        return all(path.exists() for path in sockets)

    try:
        _wait_until(ready, proc, logfile, "the sandbox gate", timeout_s=15.0)
        yield listen
    finally:
        stop(proc)


def _wait_until(
    ready: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    logfile: Path,
    what: str,
    *,
    timeout_s: float,
) -> None:
    """Poll `ready` until it holds; a `ConfigError` with the end of `logfile` if `proc` exits
    first, or naming `logfile` if `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            tail = logfile.read_text(errors="replace")[-2000:]
            raise ConfigError(f"{what} exited at start with code {proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise ConfigError(f"{what} was not ready within {timeout_s:.0f} s; see {logfile}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM, and SIGKILL if it has not exited within STOP_TIMEOUT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def worker_env(settings: Settings) -> dict[str, str]:
    """The environment a worker subprocess needs to see the same settings."""
    env = {
        "BATON_REDIS_URL": settings.require_redis_url(),
        "BATON_REPO_CACHE_DIR": str(settings.repo_cache_dir),
        "BATON_MODEL": settings.model,
        "BATON_STREAMING": str(settings.streaming).lower(),
    }
    if settings.redis_ca_file is not None:
        env["BATON_REDIS_CA_FILE"] = str(settings.redis_ca_file)
    if settings.gemini_base_url:
        env["BATON_GEMINI_BASE_URL"] = settings.gemini_base_url
    if settings.google_api_key is not None:
        env["GOOGLE_API_KEY"] = settings.google_api_key.get_secret_value()
    return env

"""compose.yaml for real: the images `make images` builds, `docker-compose up` with the fake
Gemini profile, the demo's Sentry event enqueued from the host through the published Redis
port, each stage run by its own worker service, the fix pushed, the run read back through
`baton serve`, and nothing left after `down -v`."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import redis
import yaml

from demo import SENTRY_EVENT
from demo.runner import make_sample_repo
from images.base import BASE_TAG
from images.build import ROOT, ensure_images, image_tag
from orchestrator.control import api
from orchestrator.core.connection import checked_config
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import FAKE_API_KEY, Settings
from sandbox import IMAGE_TAG as SANDBOX_IMAGE
from sandbox.build import ENV_REPOSITORY
from sandbox.gate.policy import GatePolicy, image_refusal
from sandbox.image import ensure_image as ensure_sandbox_image
from tests.containers import sandboxes
from tests.repos import Git

COMPOSE_FILES = (ROOT / "compose.yaml", Path(__file__).with_name("compose.test.yaml"))
STAGES = ("triage", "search", "plan", "reproduce", "fix", "review", "pr")
WORKER_UID = 1000
"""The image's user, who must own a repository the code stages push to."""
RUN_TIMEOUT_S = 480.0
COMPOSE_TIMEOUT_S = 300.0
SERVE_PORT = 8080
HEALTH_PATH = "/api/v1/health"
WORKER_SECRETS = ("GOOGLE_API_KEY", "BATON_GITHUB_TOKEN")
"""Only worker services may get these (the pr stage both)."""
PLACEHOLDER = "change-me"
"""How every password and secret in .env.example begins."""


@pytest.fixture(scope="session")
def baton_image() -> str:
    """Baton's image, built (or found up to date) by the builder `make images` runs."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: run `make setup`")
    ensure_sandbox_image()  # the code stages start their sandboxes on this host's daemon

    def say(line: str) -> None:
        print(f"images: {line}", file=sys.stderr)

    return ensure_images(progress=say)


REDIS_USERS = ("worker", "serve", "flower", "cli")
"""Redis's users besides its admin: compose.yaml's services' and the operator's (`cli`)."""


def redis_passwords() -> dict[str, str]:
    """A new password for Redis's admin (`default`) and each of its users."""
    return {user: secrets.token_hex(16) for user in ("default", *REDIS_USERS)}


def redis_variables(passwords: dict[str, str]) -> dict[str, str]:
    """The variables of .env that hold them (BATON_REDIS_PASSWORD is the admin's)."""
    return {
        "BATON_REDIS_PASSWORD" if user == "default" else f"BATON_REDIS_{user.upper()}_PASSWORD":
        password
        for user, password in passwords.items()
    }  # fmt: skip


@dataclass
class Stack:
    """One docker-compose project of compose.yaml plus the test's override file."""

    project: str
    env_file: Path
    redis_passwords: dict[str, str]
    flower_login: tuple[str, str]
    serve_login: tuple[str, str]

    def compose(self, *args: str, check: bool = True) -> str:
        argv = ["docker-compose", "-p", self.project, "--env-file", str(self.env_file)]
        for path in COMPOSE_FILES:
            argv += ["-f", str(path)]
        result = subprocess.run(
            [*argv, "--profile", "fake", *args],
            capture_output=True,
            text=True,
            timeout=COMPOSE_TIMEOUT_S,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"docker-compose {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout

    def host_port(self, service: str, port: int) -> int:
        address = self.compose("port", service, str(port)).strip()
        return int(address.rsplit(":", 1)[1])

    def redis_url(self, user: str | None = "cli") -> str:
        """Redis's published port, as `user` (`default`: the admin) or without a login."""
        port = self.host_port("redis", 6379)
        login = f"{user}:{self.redis_passwords[user]}@" if user else ""
        return f"redis://{login}127.0.0.1:{port}/0"

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "30")


@pytest.fixture
def stack(baton_image: str, tmp_path: Path) -> Iterator[Stack]:
    """A project with a unique name, a random Redis password and the fake Gemini server; taken
    down with its volumes at the end whatever happened."""
    repos = tmp_path / "repos"
    repos.mkdir()
    passwords = redis_passwords()
    login = ("baton", secrets.token_hex(8))
    serve_login = ("operator", secrets.token_hex(8))
    project = f"batontest{secrets.token_hex(4)}"
    env = {
        "BATON_IMAGE": baton_image,
        "BATON_REDIS_IMAGE": BASE_TAG,
        "BATON_EGRESS_VOLUME": f"{project}-egress",
        **redis_variables(passwords),
        "BATON_DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        "BATON_FLOWER_USER": login[0],
        "BATON_FLOWER_PASSWORD": login[1],
        "BATON_FLOWER_PORT": "0",  # any free port of the host
        "BATON_SERVE_USER": serve_login[0],
        "BATON_SERVE_PASSWORD": serve_login[1],
        "BATON_SERVE_SECRET": secrets.token_hex(32),
        "BATON_SERVE_PORT": "0",
        "GOOGLE_API_KEY": FAKE_API_KEY,
        "BATON_GEMINI_BASE_URL": "http://fake-gemini:8080",
        "BATON_TEST_REPOS": str(repos),
    }
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    made = Stack(project, env_file, passwords, login, serve_login)
    try:
        yield made
    finally:
        made.down()


CONFIG_PASSWORDS = {user: f"{user}-password-0123456789" for user in ("default", *REDIS_USERS)}
"""The Redis passwords `docker-compose config` renders with (no Redis runs)."""


def _config(tmp_path: Path, **settings: str) -> dict[str, Any]:
    """`docker-compose config`: compose.yaml with the test's file, resolved against an env
    file of just the required settings and these."""
    required = {
        **redis_variables(CONFIG_PASSWORDS),
        "BATON_DOCKER_GID": "0",
        "BATON_FLOWER_USER": "u",
        "BATON_FLOWER_PASSWORD": "p",
        "BATON_SERVE_USER": "s",
        "BATON_SERVE_PASSWORD": "q",
        "BATON_SERVE_SECRET": "k",
        "BATON_TEST_REPOS": "/nowhere",
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in {**required, **settings}.items()))
    stack = Stack("batonconfig", env_file, CONFIG_PASSWORDS, ("u", "p"), ("s", "q"))
    config: dict[str, Any] = yaml.safe_load(stack.compose("config"))
    return config


def _published(port: str | dict[str, Any]) -> tuple[str, int]:
    """(host address, container port) of a published port, in docker-compose 1.29's short
    form (`127.0.0.1:8080:8080/tcp`) or Compose v2's long one."""
    if isinstance(port, dict):
        return port.get("host_ip", "0.0.0.0"), int(port["target"])
    parts = port.split("/")[0].split(":")
    return (parts[0] if len(parts) == 3 else "0.0.0.0"), int(parts[-1])


def test_compose_defaults_to_the_image_tags_make_images_builds(tmp_path: Path) -> None:
    config = _config(tmp_path)
    images = {name: service["image"] for name, service in config["services"].items()}
    assert images == {
        "redis": BASE_TAG,
        **dict.fromkeys(
            [*STAGES, "builder", "sandbox-gate", "flower", "serve", "fake-gemini"], image_tag()
        ),
    }


def test_compose_serves_the_api_on_loopback_with_a_health_check_and_nothing_but_redis(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, GOOGLE_API_KEY="model-key", BATON_GITHUB_TOKEN="gh-token")
    serve = config["services"]["serve"]
    assert serve["command"] == ["serve", "--port", str(SERVE_PORT)]
    assert [_published(port) for port in serve["ports"]] == [("127.0.0.1", SERVE_PORT)]
    test = serve["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"http://127.0.0.1:{SERVE_PORT}{HEALTH_PATH}" in test[3]
    assert serve["depends_on"] == {"redis": {"condition": "service_healthy"}}
    environment = serve["environment"]
    assert not set(WORKER_SECRETS) & set(environment)  # and each secret's own test below
    assert "DOCKER_HOST" not in environment
    assert (
        environment["BATON_REDIS_URL"] == f"redis://serve:{CONFIG_PASSWORDS['serve']}@redis:6379/0"
    )
    login = {key: environment[f"BATON_SERVE_{key}"] for key in ("USER", "PASSWORD", "SECRET")}
    assert login == {"USER": "s", "PASSWORD": "q", "SECRET": "k"}
    # No socket, no volume at all, no extra group; the least privilege Flower has, and more.
    assert "volumes" not in serve and "group_add" not in serve
    assert serve["cap_drop"] == ["ALL"]
    assert serve["security_opt"] == ["no-new-privileges:true"]
    assert serve["read_only"] is True and serve["tmpfs"] == ["/tmp"]
    assert serve["user"].split(":")[0] not in ("", "0", "root")


def test_secrets_and_the_docker_socket_reach_only_the_services_that_use_them(
    tmp_path: Path,
) -> None:
    """The model keys go to every stage's worker (and nowhere else), the GitHub token to the
    one stage that publishes (pr), the Docker socket to the sandbox gate alone; the stages with
    tools reach dockerd only through the gate, under gVisor unless told otherwise."""
    config = _config(
        tmp_path,
        GOOGLE_API_KEY="model-key",
        OPENAI_API_KEY="openai-key",
        ANTHROPIC_API_KEY="anthropic-key",
        BATON_GITHUB_TOKEN="gh-token",
        BATON_GITHUB_API_URL="https://github.example.com/api/v3",
    )
    fixer = load_pipeline("fixer")
    assert [stage.name for stage in fixer.stages] == list(STAGES)
    for name, service in config["services"].items():
        environment = service.get("environment", {})
        stage = fixer.stage(name) if name in STAGES else None
        if stage is not None:  # one service per stage queue, `baton.fixer.<stage>`
            assert service["command"][:5] == ["worker", "--pipeline", "fixer", "--stages", name]
        model_keys = [environment.get(k) for k in ("GOOGLE_API_KEY", "OPENAI_API_KEY",
                                                   "ANTHROPIC_API_KEY")]  # fmt: skip
        assert model_keys == (["model-key", "openai-key", "anthropic-key"] if stage else [None] * 3)
        publishes = stage is not None and "publish" in stage.tools
        assert publishes == (name == "pr")
        token = environment.get("BATON_GITHUB_TOKEN")
        assert token == ("gh-token" if publishes else None), name
        assert ("BATON_GITHUB_API_URL" in environment) == publishes, name
        sockets = [v for v in service.get("volumes", []) if "docker.sock" in str(v)]
        assert bool(sockets) == (name == "sandbox-gate"), name
        assert ("group_add" in service) == (name == "sandbox-gate"), name
        through_gate = environment.get("DOCKER_HOST") == "unix:///run/baton-gate/docker.sock"
        assert through_gate == bool(stage and stage.tools), name
        if through_gate:
            assert environment["BATON_SANDBOX__RUNTIME"] == "runsc"
            gate_volume = [v for v in service["volumes"] if "/run/baton-gate" in str(v)]
            assert [_mount(v) for v in gate_volume] == [("sandbox-gate", "/run/baton-gate", True)]
    gate = config["services"]["sandbox-gate"]
    assert gate["command"][0] == "sandbox-gate" and "--runtime=runsc" in gate["command"]
    prefixes = tuple(
        a.split("=", 1)[1] for a in gate["command"] if a.startswith("--allow-image-prefix=")
    )
    allowed = GatePolicy(image_prefixes=prefixes)
    for image in (SANDBOX_IMAGE, f"{ENV_REPOSITORY}:0123456789abcdef"):
        assert image_refusal(allowed, image) is None, image
    assert image_refusal(allowed, "alpine:3") is not None
    assert "GOOGLE_API_KEY" not in gate.get("environment", {})
    assert gate["cap_drop"] == ["ALL"] and gate["read_only"] is True
    assert gate["user"].split(":")[0] not in ("", "0", "root")


def test_only_the_builder_holds_the_gate_s_build_socket_and_the_egress_folder(
    tmp_path: Path,
) -> None:
    """Builds are asked for through the gate's build socket, which no code stage mounts; the
    builder serves the egress proxy on the volume the gate lets a build container bind, and
    gets no model key or token."""
    config = _config(tmp_path, GOOGLE_API_KEY="model-key", BATON_GITHUB_TOKEN="gh-token")
    services = config["services"]
    holders = {
        name for name, service in services.items()
        for volume in service.get("volumes", []) if _mount(volume)[0] == "sandbox-gate-build"
    }  # fmt: skip
    assert holders == {"builder", "sandbox-gate"}
    builder = services["builder"]
    assert builder["command"][:2] == ["worker", "--builder"]
    environment = builder["environment"]
    assert environment["DOCKER_HOST"] == "unix:///run/baton-build/docker.sock"
    assert "GOOGLE_API_KEY" not in environment and "BATON_GITHUB_TOKEN" not in environment
    egress = [_mount(v) for v in builder["volumes"] if _mount(v)[1] == "/run/baton-egress"]
    assert egress == [("egress", "/run/baton-egress", False)]
    assert config["volumes"]["egress"]["name"] == environment["BATON_BUILD__EGRESS_SOURCE"]
    gate = services["sandbox-gate"]["command"]
    assert "--build-listen=/run/baton-build/docker.sock" in gate
    assert f"--allow-egress-source={environment['BATON_BUILD__EGRESS_SOURCE']}" in gate
    assert not any(a.startswith("--allow-network") for a in gate)
    for name in STAGES:
        handoff = services[name]["environment"].get("BATON_BUILD__HANDOFF")
        through_gate = "DOCKER_HOST" in services[name]["environment"]
        assert handoff == ("true" if through_gate else None), name


def _mount(volume: str | dict[str, Any]) -> tuple[str, str, bool]:
    """(source, target, read-only) of a volume in docker-compose 1.29's short form
    (`name:/path:ro`) or Compose v2's long one."""
    if isinstance(volume, dict):
        return volume["source"], volume["target"], bool(volume.get("read_only"))
    source, target, *mode = volume.split(":")
    return source, target, mode == ["ro"]


def _redis_script(config: dict[str, Any]) -> str:
    """Redis's shell script as the container runs it (`config` keeps `$$` escaped)."""
    shell, flag, script = config["services"]["redis"]["command"]
    assert (shell, flag) == ("sh", "-c")
    return str(script).replace("$$", "$")


def test_redis_caps_its_memory_never_evicts_and_runs_without_privileges(tmp_path: Path) -> None:
    config = _config(tmp_path, BATON_REDIS_MAXMEMORY="300mb")
    redis_service = config["services"]["redis"]
    command = _redis_script(config).split("<<")[0].split("exec ", 1)[1].replace("\\\n", " ")
    words = command.split()
    assert words[:2] == ["redis-server", "-"]  # configuration (the password) on stdin
    flags = dict(zip(words[2::2], words[3::2], strict=True))
    assert flags["--maxmemory"] == "300mb" and flags["--maxmemory-policy"] == "noeviction"
    assert flags["--appendonly"] == "yes" and flags["--appendfsync"] == "everysec"
    assert redis_service["cap_drop"] == ["ALL"]
    assert redis_service["security_opt"] == ["no-new-privileges:true"]
    assert redis_service["user"] == "redis"
    default = _redis_script(_config(tmp_path / "default"))
    assert "--maxmemory 1gb " in default


def _example_values(path: Path) -> dict[str, str]:
    """KEY=value lines of an example env file, commented-out ones included."""
    values = {}
    for line in path.read_text().splitlines():
        key, equals, value = line.lstrip("#").partition("=")
        if equals and re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            values[key] = value
    return values


def _redis_users_mounted(config: dict[str, Any]) -> dict[str, Path]:
    """Where the redis service finds each file it mounts, by its path in the container."""
    found = {}
    for volume in config["services"]["redis"]["volumes"]:
        source, target, read_only = _mount(volume)
        if source.startswith("/"):
            assert read_only, target
            found[target] = Path(source)
    return found


def _start_redis_script(
    tmp_path: Path, variables: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Redis's script as Compose runs it, its mounted files where they are in this repository,
    with a stand-in redis-server that shows what it was given."""
    stand_in = tmp_path / "bin"
    stand_in.mkdir(exist_ok=True)
    (stand_in / "redis-server").write_text('#!/bin/sh\necho "args: $*"\ncat\n')
    (stand_in / "redis-server").chmod(0o755)
    config = _config(tmp_path / "config")
    script = _redis_script(config)
    for target, source in _redis_users_mounted(config).items():
        script = script.replace(target, str(source))
    env = {"PATH": f"{stand_in}:/usr/bin:/bin", **variables}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10)


def test_redis_makes_its_users_from_the_acl_kubernetes_uses_with_passwords_off_argv(
    tmp_path: Path,
) -> None:
    mounted = _redis_users_mounted(_config(tmp_path / "config"))
    assert {path.relative_to(ROOT) for path in mounted.values()} == {
        Path("k8s/baton/redis-users.acl"),
        Path("k8s/baton/redis-users.sh"),
    }
    passwords = redis_passwords()
    started = _start_redis_script(tmp_path, redis_variables(passwords))
    assert started.returncode == 0, started.stderr
    args, *config = started.stdout.splitlines()
    assert not any(password in args for password in passwords.values())  # not on argv
    made = {line.split()[1]: line.split()[4] for line in config}
    assert made == {user: f">{password}" for user, password in passwords.items()}
    # The operator's `cli` is made only when its password is set.
    without_cli = {k: v for k, v in redis_variables(passwords).items() if "_CLI_" not in k}
    assert "user cli " not in _start_redis_script(tmp_path, without_cli).stdout


def test_each_service_logs_in_to_redis_as_its_own_user(tmp_path: Path) -> None:
    config = _config(tmp_path)
    services = config["services"]
    users = {name: "worker" for name in [*STAGES, "builder"]} | {
        "serve": "serve",
        "flower": "flower",
    }
    for name, user in users.items():
        url = services[name]["environment"]["BATON_REDIS_URL"]
        assert url == f"redis://{user}:{CONFIG_PASSWORDS[user]}@redis:6379/0", name
        assert checked_config(url).url == url  # what Baton's settings accept
    holders = {
        name
        for name, service in services.items()
        if "BATON_REDIS_URL" in service.get("environment", {})
    }
    assert holders == set(users)
    # Redis's admin password goes to Redis alone.
    admin = CONFIG_PASSWORDS["default"]
    for name, service in services.items():
        exposed = admin in str(service.get("environment", {}))
        assert exposed == (name == "redis"), name


def test_example_passwords_are_placeholders_and_redis_refuses_its_own(tmp_path: Path) -> None:
    """Every password and secret in .env.example says `change-me`; Redis started with an
    example's password, or a short one, exits before it serves (and the whole stack waits on
    Redis)."""
    examples = _example_values(ROOT / ".env.example")
    secret = [k for k in examples if re.search(r"PASSWORD|SECRET", k)]
    assert {"BATON_FLOWER_PASSWORD", "BATON_SERVE_SECRET", *redis_variables(CONFIG_PASSWORDS)} <= (
        set(secret)
    )
    for key in secret:
        assert examples[key].startswith(PLACEHOLDER), key
    good = redis_variables(redis_passwords())
    for variable in good:
        for wrong, said in (
            (examples[variable], "still holds the example placeholder"),
            ("0123abcd", "is shorter than 16 characters"),
        ):
            refused = _start_redis_script(tmp_path, {**good, variable: wrong})
            assert refused.returncode == 1 and refused.stdout == "", variable
            assert f"redis-users: {variable} {said}" in refused.stderr
            assert wrong not in refused.stderr


def _zombies_after_an_orphan_exits(
    client: docker.DockerClient, image: str, **run: Any
) -> tuple[str, int]:
    """Start `image` (the fake server: a process that never waits for others' children), make an
    orphan in it that exits at once: (PID 1's name, the zombies left a second later)."""
    container = client.containers.run(
        image, ["fake-gemini", "--host", "127.0.0.1"], detach=True, network_mode="none", **run
    )
    try:
        deadline = time.monotonic() + 30
        while container.exec_run(["true"]).exit_code != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        pid1 = container.exec_run(["cat", "/proc/1/comm"]).output.decode().strip()
        # The subshell exits before `sleep 0`: sleep's parent becomes PID 1.
        container.exec_run(["sh", "-c", "(sleep 0.3 &); true"])
        time.sleep(1.5)
        states = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/stat"]).output.decode()
        zombies = sum(1 for line in states.splitlines() if line.rsplit(")", 1)[1].split()[0] == "Z")
        return pid1, zombies
    finally:
        container.remove(force=True)


def test_the_image_runs_tini_as_pid_1_and_orphans_leave_no_zombies(baton_image: str) -> None:
    client = docker.from_env()
    try:
        entrypoint = client.images.get(baton_image).attrs["Config"]["Entrypoint"]
        assert entrypoint == ["tini", "--", "baton"]
        assert _zombies_after_an_orphan_exits(client, baton_image) == ("tini", 0)
        # The same without tini (Baton as PID 1) keeps the zombie: the check can see one.
        pid1, zombies = _zombies_after_an_orphan_exits(client, baton_image, entrypoint=["baton"])
        assert (pid1, zombies) == ("baton", 1)
    finally:
        client.close()


@pytest.mark.timeout(2400)
def test_compose_stack_fixes_the_demo_issue_end_to_end_and_leaves_nothing_behind(
    stack: Stack, baton_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, git: Git
) -> None:
    client = docker.from_env()
    services = _services(stack, client, baton_image)
    stack.compose("up", "-d", *services)
    run_id = ""
    try:
        settings = Settings(redis_url=stack.redis_url())
        _check_redis(stack)
        repo = _sample_repo(tmp_path, monkeypatch, git)
        run_id = api.enqueue(
            SENTRY_EVENT.read_bytes(), repo=str(repo), pipeline="fixer", settings=settings
        )
        with _runtimes_of_sandboxes(client, run_id) as runtimes:
            run = _wait_for(run_id, settings)
        assert run.status == RunStatus.DONE, (run.status, run.reason)
        # Every sandbox of the run came through the gate, under gVisor; no worker holds the
        # socket, and the gate refused nothing Baton asked for.
        assert runtimes and set(runtimes.values()) == {"runsc"}, runtimes
        _check_no_worker_mounts_the_docker_socket(stack, client)
        gate_log = stack.compose("logs", "--no-color", "sandbox-gate")
        assert "refused" not in gate_log, gate_log[-2000:]
        # The environment was built by `builder` (the code stages hand builds over), and the
        # build container reached the registry through its egress proxy.
        builder_log = stack.compose("logs", "--no-color", "builder")
        assert f"built baton-env:{run.environment}" in builder_log, builder_log[-2000:]
        assert {name: run.stages[name].status for name in STAGES} == dict.fromkeys(
            STAGES, StageStatus.DONE
        )
        _check_each_stage_ran_in_its_own_service(stack, client, run)
        pushed = git("rev-parse", f"baton/{run_id}^", cwd=repo)
        assert pushed == run.commit  # one commit on top of the pinned one
        _check_workers_healthy(stack, client)
        _check_metrics(stack)
        if "flower" in services:
            _check_flower(stack)
        _check_serve(stack, client, run_id)
        stack.compose("up", "-d", "--no-deps", "--scale", "fix=2", "fix")
        assert len(_containers(client, stack.project, "fix")) == 2
    except BaseException:
        print(stack.compose("logs", "--no-color", "--tail", "60", check=False))
        raise
    finally:
        stack.down()
    ours = {"label": f"com.docker.compose.project={stack.project}"}
    assert client.containers.list(all=True, filters=ours) == []
    assert client.volumes.list(filters=ours) == []
    assert client.networks.list(filters=ours) == []
    assert sandboxes(run_id) == []


@contextmanager
def _runtimes_of_sandboxes(client: docker.DockerClient, run_id: str) -> Iterator[dict[str, str]]:
    """While the block runs: the OCI runtime of each sandbox named for `run_id`, by container
    id, looked at every 0.2 s (a sandbox lives for seconds)."""
    seen: dict[str, str] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for found in client.api.containers(all=True, filters={"name": run_id}):
                if found["Id"] not in seen:
                    try:
                        inspected = client.api.inspect_container(found["Id"])
                    except docker.errors.NotFound:
                        continue
                    seen[found["Id"]] = inspected["HostConfig"].get("Runtime") or ""
            done.wait(0.2)

    watcher = threading.Thread(target=watch, name="sandbox-runtimes", daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(timeout=10)


def _check_no_worker_mounts_the_docker_socket(stack: Stack, client: docker.DockerClient) -> None:
    for name in STAGES:
        for container in _containers(client, stack.project, name):
            sources = [m.get("Source", "") for m in container.attrs["Mounts"]]
            assert not any(s.endswith("docker.sock") for s in sources), (name, sources)
    (gate,) = _containers(client, stack.project, "sandbox-gate")
    assert any(m["Source"] == "/var/run/docker.sock" for m in gate.attrs["Mounts"])


def _services(stack: Stack, client: docker.DockerClient, image: str) -> list[str]:
    """Every service; Flower's only once the image has `baton flower`."""
    names = stack.compose("config", "--services").split()
    try:
        client.containers.run(image, ["flower", "--help"], remove=True, network_mode="none")
    except docker.errors.ContainerError:
        print("this image has no `baton flower` yet: the stack runs without Flower")
        names.remove("flower")
    return names


def _check_redis(stack: Stack) -> None:
    """Durable, never evicting, and closed without a password; its configuration is the
    admin's to read, not the operator's user's."""
    client = redis.Redis.from_url(stack.redis_url("default"), decode_responses=True)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert set(client.acl_users()) == {"default", *REDIS_USERS}
    finally:
        client.close()
    anonymous = redis.Redis.from_url(stack.redis_url(None))
    operator = redis.Redis.from_url(stack.redis_url("cli"))
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        assert operator.ping() is True
        with pytest.raises(redis.exceptions.NoPermissionError):
            operator.config_get("requirepass")
    finally:
        anonymous.close()
        operator.close()


def _sample_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, git: Git) -> Path:
    """The demo's bare repository, owned by the workers' user, as a deployment must have it,
    with a dependency file added: its environment is built (by `builder`, through the gate's
    build socket, its downloads through the egress proxy). The host trusts it for its own git
    commands (it is another user's repository)."""
    repos = tmp_path / "repos"
    repo = make_sample_repo(repos / "shopcart.git")
    work = tmp_path / "work"
    git("clone", "-q", repo, work)
    (work / "requirements.txt").write_text("iniconfig==2.0.0\n")
    git("add", "requirements.txt", cwd=work)
    git("commit", "-q", "-m", "requirements.txt", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    for path in [repos, *repos.rglob("*")]:
        os.chown(path, WORKER_UID, WORKER_UID, follow_symlinks=False)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    monkeypatch.setenv("HOME", str(home))
    return repo


def _wait_for(run_id: str, settings: Settings) -> RunRecord:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        run = api.get_run(run_id, settings=settings)
        if run.status.is_terminal or time.monotonic() > deadline:
            return run
        time.sleep(1.0)


def _check_each_stage_ran_in_its_own_service(
    stack: Stack, client: docker.DockerClient, run: RunRecord
) -> None:
    """A stage's owner names its host: the hostname of a container of that stage's service."""
    for name in STAGES:
        hosts = {c.id[:12] for c in _containers(client, stack.project, name)}
        owner = run.stages[name].owner or ""
        assert owner.split(":")[0] in hosts, (name, owner, hosts)


def _check_workers_healthy(stack: Stack, client: docker.DockerClient) -> None:
    """The health check on the age of BATON_HEALTH_FILE passes in every worker."""
    deadline = time.monotonic() + 120
    while True:
        states = {
            c.name: c.attrs["State"].get("Health", {}).get("Status")
            for name in STAGES
            for c in _containers(client, stack.project, name)
        }
        if set(states.values()) == {"healthy"} or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert set(states.values()) == {"healthy"}, states


def _check_metrics(stack: Stack) -> None:
    """Each worker serves its own stage's figures on :9808 inside the compose network."""
    url = "http://127.0.0.1:9808/metrics"
    scrape = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    for stage in STAGES:
        text = stack.compose("exec", "-T", stage, "python3", "-c", scrape)
        labels = f'outcome="done",pipeline="fixer",stage="{stage}"'
        done = f"baton_stage_duration_seconds_count{{{labels}}} 1.0"
        assert done in text, f"{stage}: {done} not in its /metrics"


def _check_flower(stack: Stack) -> None:
    """Flower answers with the login only."""
    url = f"http://127.0.0.1:{stack.host_port('flower', 5555)}/api/workers"
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = httpx.get(url, auth=stack.flower_login, timeout=5)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    assert answer.status_code == 200
    assert httpx.get(url, timeout=5).status_code == 401


def _check_serve(stack: Stack, client: docker.DockerClient, run_id: str) -> None:
    """`baton serve` turns healthy, answers its health check without a login, serves its UI's
    pages (package data in the image) and lists the run to its login only; its container holds
    no worker secret and no mount."""
    (serve,) = _containers(client, stack.project, "serve")
    deadline = time.monotonic() + 60
    while serve.attrs["State"]["Health"]["Status"] != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
        serve.reload()
    assert serve.attrs["State"]["Health"]["Status"] == "healthy", serve.attrs["State"]["Health"]
    names = {var.partition("=")[0] for var in serve.attrs["Config"]["Env"]}
    assert not set(WORKER_SECRETS) & names
    assert serve.attrs["Mounts"] == []
    base = f"http://127.0.0.1:{stack.host_port('serve', SERVE_PORT)}"
    with httpx.Client(base_url=base, timeout=5) as http:
        health = http.get(HEALTH_PATH)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert http.get("/api/v1/runs").status_code == 401
        page = http.get("/login")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        user, password = stack.serve_login
        login = http.post("/login", data={"user": user, "password": password})
        assert (login.status_code, login.headers["location"]) == (303, "/")
        listed = http.get("/api/v1/runs")
    assert listed.status_code == 200
    statuses = {run["run_id"]: run["status"] for run in listed.json()["runs"]}
    assert statuses == {run_id: RunStatus.DONE.value}


def _containers(client: docker.DockerClient, project: str, service: str) -> list:
    return client.containers.list(
        filters={
            "label": [
                f"com.docker.compose.project={project}",
                f"com.docker.compose.service={service}",
            ]
        }
    )

"""`DockerSandbox`: one fresh, locked-down container per use, with real exec timeouts.

    with DockerSandbox.start(cfg, labels={"baton.run": run_id}) as box:
        box.put_archive(cfg.workspace, tree)
        result = box.exec(["python3", "-m", "pytest", "-q"], timeout_s=300)

The container is removed when the `with` block ends, however it ends. If the process dies
first, the container ends itself after `cfg.ttl_s` (its PID 1 is `sleep ttl_s` under tini, and
it is auto-removed), and `reap()` removes it sooner once it sees the owner is gone.

How a command runs (each point verified against dockerd 20.10 with runc):

- runc makes every exec'd process a session and process-group leader, so the wrapper shell's
  pid is the group id of the command and of every child it does not move elsewhere. The
  wrapper writes that pid to /tmp/.baton/<token>.pid, then `exec`s the command: no shell stays
  in between, and exit codes (128 + signal) come through unchanged.
- Output is read with deadlines (`stream.py`). While the command runs, `exec_inspect` is polled
  with a growing interval. At the timeout, or when the command has exited but a background
  child still holds its stdout open (moby#33039), another exec kills the whole group
  (`kill -9 -<pgid>`; no fork needed, so it works even against a fork bomb at the pids limit).
- OOM kills are read from the container's memory cgroup: the wrapper records the kernel's
  `oom_kill` counter before the command, and a command that ends non-zero has it compared with
  the counter after. The counter is raised before the victim dies. Docker's `oom` event also
  reports it here, but about 10 ms after the exec's exit, so it cannot be read reliably at
  that moment; `State.OOMKilled` stays false when the victim is not PID 1.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import PurePosixPath
from types import MappingProxyType

import docker
import docker.errors
from docker.types import DriverConfig, LogConfig, Mount

from sandbox import labels as label
from sandbox.client import connected, remove, translated
from sandbox.config import IMAGE_TAG, SandboxConfig
from sandbox.errors import SandboxError, SandboxFileError, SandboxStartError
from sandbox.files import read_archive_file
from sandbox.models import ExecResult
from sandbox.stream import Capture, ExecStream

logger = logging.getLogger(__name__)

BASE_ENV = {
    "HOME": "/tmp",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""The whole environment of a sandbox, apart from what the caller passes explicitly. Nothing is
ever copied from the host's environment."""

STATE_DIR = "/tmp/.baton"
_OOM_COUNT = (  # sets $n to the memory cgroup's oom_kill counter (v1, then v2); builtins only
    "n=; for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do "
    'if [ -r $f ]; then while read -r k v; do [ "$k" = oom_kill ] && n=$v; done < $f; break; fi; '
    "done"
)
WRAPPER = [
    "sh",
    "-c",
    f"t=$1; shift; {{ [ -d {STATE_DIR} ] || mkdir -p {STATE_DIR}; echo $$ > {STATE_DIR}/$t.pid; "
    f'{_OOM_COUNT}; echo "$n" > {STATE_DIR}/$t.oom; }} 2>/dev/null; exec "$@" 2>&1',
    "sh",
]
"""Runs `<token> argv...`: records the group id and the OOM counter, then becomes argv with
stderr on the same pipe as stdout, so that their interleaving is the order they were written
(Docker copies two pipes independently and may reorder them)."""
KILL_GROUP = [
    "sh",
    "-c",
    f'read -r g < {STATE_DIR}/$1.pid || exit 1; kill -9 -"$g" 2>/dev/null || kill -9 "$g"; exit 0',
    "sh",
]
OOM_SINCE = ["sh", "-c", f'read -r b < {STATE_DIR}/$1.oom; {_OOM_COUNT}; echo "$b $n"', "sh"]
WORKSPACE_SEED = "/opt/baton/workspace"
"""Where an environment image keeps what a sandbox's workspace starts with (its build's
products, `sandbox.build`): the workspace is a fresh tmpfs, which Docker does not fill from the
image, so each sandbox copies the seed in at its start."""
SEED_WORKSPACE = [
    "sh", "-c", f'[ ! -d {WORKSPACE_SEED} ] || cp -a {WORKSPACE_SEED}/. "$1"/', "sh",
]  # fmt: skip
WRITE_FILE = ["sh", "-c", 'umask 022 && mkdir -p "$(dirname "$1")" && cat > "$1"', "sh"]

FIRST_POLL_S = 0.01
"""First wait before asking Docker whether the command still runs; doubles up to `MAX_POLL_S`."""
MAX_POLL_S = 0.5
GRACE_S = 0.2
"""How long output may still arrive after the command exited before its group is killed."""
DRAIN_S = 1.0
"""How long to read after a kill before the stream is abandoned."""
KILL_ATTEMPTS = 10

_NOTHING: Mapping[str, str] = MappingProxyType({})


class DockerSandbox:
    """A running sandbox container. Get one from `DockerSandbox.start`, never directly."""

    def __init__(
        self,
        client: docker.DockerClient,
        cfg: SandboxConfig,
        container_id: str,
        *,
        user: str | None = None,
    ) -> None:
        self._client = client
        self._api = client.api
        self.cfg = cfg
        self.id = container_id
        self.user = user or cfg.user
        """Who commands run as: `cfg.user`, except in an environment's build container
        (`sandbox.build`), which installs packages as root."""

    @classmethod
    @contextmanager
    def start(
        cls,
        cfg: SandboxConfig,
        *,
        labels: Mapping[str, str] = _NOTHING,
        env: Mapping[str, str] = _NOTHING,
        client: docker.DockerClient | None = None,
    ) -> Iterator[DockerSandbox]:
        """Create and start a container for `cfg`, yield it, and remove it (with its workspace
        volume) when the block ends, also on an exception. `env` is added to `BASE_ENV` for
        every command; `labels` to Baton's own (which win)."""
        with connected(client) as docker_client:
            box = cls(docker_client, cfg, _create(docker_client, cfg, labels, env))
            try:
                yield box
            finally:
                box._remove()

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run `argv` (no shell) as the sandbox's user and wait for it, at most `timeout_s`
        (default `cfg.exec_timeout_s`); then its whole process group is killed. A background
        child still holding the output open when the command exits is killed too. `stdin`, if
        given, is written to the command's stdin, which is then closed."""
        if not argv or any("\0" in arg for arg in argv):
            raise ValueError("argv must name a program and hold no NUL characters")
        timeout = self.cfg.exec_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout}")
        limit = self.cfg.max_output_bytes if max_output_bytes is None else max_output_bytes
        token = uuid.uuid4().hex
        started = time.monotonic()
        with translated(f"running {argv[0]!r} in sandbox {self.id[:12]}"):
            exec_id = self._api.exec_create(
                self.id,
                [*WRAPPER, token, *argv],
                stdin=stdin is not None,
                user=self.user,
                workdir=workdir or self.cfg.workspace,
                environment=dict(env or {}),
            )["Id"]
            stream = ExecStream(self._api.exec_start(exec_id, socket=True), Capture(limit))
            try:
                if stdin is not None:
                    stream.send_stdin(stdin)
                exit_code, timed_out = self._follow(exec_id, token, stream, started + timeout)
            finally:
                stream.close()
            oom = not timed_out and exit_code != 0 and self._oom_killed_since(token)
        result = ExecResult(
            exit_code=exit_code,
            output=stream.capture.text(),
            timed_out=timed_out,
            oom_killed=oom,
            truncated=stream.capture.truncated,
            duration_s=round(time.monotonic() - started, 4),
        )
        logger.debug(
            "sandbox %s: %s %s in %.2fs, %d bytes kept, %d dropped",
            self.id[:12], argv[0], result.status, result.duration_s,
            len(stream.capture.kept), stream.capture.dropped,
        )  # fmt: skip
        return result

    def put_archive(self, path: str, tar_bytes: bytes) -> None:
        """Unpack a tar archive into `path`, a directory under the workspace (the archive API
        cannot write elsewhere: the root is read-only and /tmp is a tmpfs it does not see).
        Owners and modes come from the archive."""
        with translated(f"unpacking {len(tar_bytes)} bytes into {path}", path=path):
            if not self._api.put_archive(self.id, path, tar_bytes):
                raise SandboxFileError(f"Docker refused to unpack an archive into {path}")

    def write_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` as the sandbox's user would: anywhere it may write (the
        workspace, /tmp), making its directory if missing, in one exec. A new file gets mode
        0644; an existing one keeps its mode."""
        result = self.exec([*WRITE_FILE, path], stdin=data)
        if result.exit_code != 0:
            raise SandboxFileError(f"cannot write {path}: {result.output.strip()[-300:]}")

    def read_file(self, path: str, *, max_bytes: int) -> bytes:
        """The contents of the regular file `path`; refused when it is larger than
        `max_bytes`. Reads what the image and the workspace hold, not /tmp (a tmpfs the
        archive API does not see: read it with `exec(["cat", path])`)."""
        if PurePosixPath(path).is_relative_to("/tmp"):
            raise SandboxFileError(
                f"cannot read {path}: /tmp is a tmpfs Docker's archive API does not see; "
                "use exec(['cat', path]) or keep the file in the workspace"
            )
        with translated(f"reading {path}", path=path):
            return read_archive_file(self._api, self.id, path, max_bytes=max_bytes)

    # -- helpers ------------------------------------------------------------------------------

    def _follow(
        self, exec_id: str, token: str, stream: ExecStream, deadline: float
    ) -> tuple[int | None, bool]:
        """Read the output until the command is over: its exit code, and whether it had to be
        killed at `deadline` (then there is no exit code)."""
        interval = FIRST_POLL_S
        while time.monotonic() < deadline:
            still_open = stream.read_until(min(deadline, time.monotonic() + interval))
            running, exit_code = self._inspect(exec_id)
            # Not running with no exit code: not started yet. Docker answers the exec's start
            # before it starts the process, so a busy host is seen here before it begins.
            if not running and exit_code is not None:
                if still_open and stream.read_until(time.monotonic() + GRACE_S):
                    logger.debug("sandbox %s: ending a background group", self.id[:12])
                    self._kill_group(token)
                    stream.read_until(time.monotonic() + DRAIN_S)
                return exit_code, False
            if not still_open:  # it closed its output but goes on: nothing to read, just wait
                time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
            interval = min(interval * 2, MAX_POLL_S)
        self._kill_group(token)
        stream.read_until(time.monotonic() + DRAIN_S)
        return None, True

    def _inspect(self, exec_id: str) -> tuple[bool, int | None]:
        info = self._api.exec_inspect(exec_id)
        return bool(info["Running"]), info.get("ExitCode")

    def _run_quietly(self, argv: Sequence[str]) -> tuple[int | None, bytes]:
        exec_id = self._api.exec_create(self.id, list(argv), user=self.user)["Id"]
        output = self._api.exec_start(exec_id)
        return self._inspect(exec_id)[1], output

    def _kill_group(self, token: str) -> None:
        """SIGKILL the command's process group. Retried while the command has not written its
        pid yet, or while a fork bomb makes Docker fail to start the killer."""
        for _ in range(KILL_ATTEMPTS):
            try:
                if self._run_quietly([*KILL_GROUP, token])[0] == 0:
                    return
            except docker.errors.APIError as exc:
                logger.debug("sandbox %s: kill failed: %s", self.id[:12], exc.explanation)
            time.sleep(0.1)
        logger.warning("sandbox %s: could not kill a timed-out command", self.id[:12])

    def _oom_killed_since(self, token: str) -> bool:
        _, output = self._run_quietly([*OOM_SINCE, token])
        try:
            before, after = (int(n) for n in output.split())
        except ValueError:
            logger.debug("sandbox %s: no oom_kill counter (%r)", self.id[:12], output[:80])
            return False
        return after > before

    def _remove(self) -> None:
        if remove(self._client, self.id):
            logger.debug("sandbox %s removed", self.id[:12])


def _create(
    client: docker.DockerClient,
    cfg: SandboxConfig,
    extra_labels: Mapping[str, str],
    env: Mapping[str, str],
    *,
    seed: bool = True,
) -> str:
    """Create and start the container; its id. `seed`: copy the image's `WORKSPACE_SEED` into
    the workspace (an image other than the base one may have one)."""
    ttl_s = cfg.ttl_s
    all_labels = {
        **extra_labels,
        label.SANDBOX: "1",
        label.EXPIRES: str(int(time.time()) + ttl_s),
        label.OWNER: label.owner(),
    }
    host_config = client.api.create_host_config(
        network_mode=cfg.network or "none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        tmpfs={"/tmp": f"rw,nosuid,nodev,size={cfg.tmp_size_mb}m"},
        mounts=[workspace_mount(cfg)],
        pids_limit=cfg.pids_limit,
        mem_limit=cfg.memory_mb * 2**20,
        memswap_limit=cfg.memory_mb * 2**20,
        nano_cpus=int(cfg.cpus * 1e9),
        init=True,
        auto_remove=True,
        log_config=LogConfig(type="json-file", config={"max-size": cfg.log_max_size}),
        runtime=cfg.runtime,
    )
    with _runtime_hint(cfg), translated(f"creating a sandbox from {cfg.image}", image=cfg.image):
        container_id: str = client.api.create_container(
            cfg.image,
            command=["sleep", str(ttl_s)],
            name=label.container_name(extra_labels),
            user=cfg.user,
            working_dir=cfg.workspace,
            environment={**BASE_ENV, **env},
            labels=all_labels,
            host_config=host_config,
        )["Id"]
    try:
        with translated(f"starting sandbox {container_id[:12]}", image=cfg.image):
            client.api.start(container_id)
        if seed and cfg.image != IMAGE_TAG:
            _seed_workspace(client, cfg, container_id)
    except SandboxError:
        remove(client, container_id)
        raise
    logger.debug("sandbox %s started from %s", container_id[:12], cfg.image)
    return container_id


def workspace_mount(cfg: SandboxConfig) -> Mount:
    """The workspace: an anonymous volume of Docker's local driver on a tmpfs of
    `cfg.workspace_mb`, owned by the sandbox's user, removed with the container."""
    uid, gid = cfg.uid_gid
    options = f"size={cfg.workspace_mb}m,uid={uid},gid={gid},mode=0755,nosuid,nodev"
    return Mount(
        target=cfg.workspace,
        source=None,
        type="volume",
        driver_config=DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options}),
    )


def _seed_workspace(client: docker.DockerClient, cfg: SandboxConfig, container_id: str) -> None:
    """Copy the environment image's `WORKSPACE_SEED` into the workspace, as the sandbox's
    user; `SandboxStartError` when it does not fit (`workspace_mb`)."""
    with translated(f"seeding the workspace of sandbox {container_id[:12]}", image=cfg.image):
        exec_id = client.api.exec_create(
            container_id, [*SEED_WORKSPACE, cfg.workspace], user=cfg.user
        )["Id"]
        output = client.api.exec_start(exec_id)
        exit_code = client.api.exec_inspect(exec_id)["ExitCode"]
    if exit_code != 0:
        raise SandboxStartError(
            f"the workspace of {cfg.image} could not be copied into sandbox "
            f"{container_id[:12]} ({cfg.workspace_mb} MB, workspace_mb): "
            f"{output.decode(errors='replace').strip()[-300:]}"
        )


@contextmanager
def _runtime_hint(cfg: SandboxConfig) -> Iterator[None]:
    """Adds what to do when dockerd does not know `cfg.runtime`."""
    try:
        yield
    except SandboxStartError as exc:
        if cfg.runtime is None or "Unknown runtime" not in str(exc):
            raise
        raise SandboxStartError(
            f"{exc}: register it in /etc/docker/daemon.json and send dockerd SIGHUP "
            f'(docs/sandboxes.md, "Sandbox hosts"), or unset BATON_SANDBOX__RUNTIME'
        ) from exc

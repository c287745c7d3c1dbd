"""The run's environment: detected or read, built once per key across the fleet, validated, and
recorded in Redis for every worker.

    environments = Environments(redis_client, mirrors, BuildSettings())
    env = environments.prepare(repo, commit)   # builds it the first time only
    env.tag, env.spec, env.baseline            # what a code stage's sandbox starts from

One build per key in the whole fleet: the builder holds a Redis lock while it builds and
validates; every other worker that needs the same key waits for the lock and then finds the
image (or the builder's failure, which it raises too, rather than build the same failure
again). The record of an environment (`baton:env:<key>`) holds what `baton env ls` shows.

A worker that may not create build containers (`BuildSettings.handoff`: it holds only the
sandbox gate's ordinary socket) hands the build to its daemon's builder (`workers.builder`) and
waits for the record the same way.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import redis

from orchestrator.core.models import RunRecord
from sandbox import SandboxConfig
from sandbox.build import (
    BuildSettings,
    EnvironmentBuildError,
    EnvironmentValidationError,
    build_environment,
    environment_tag,
    validate_environment,
)
from sandbox.client import connected, translated
from sandbox.environment import EnvironmentSpec, detect, environment_key, from_table
from sandbox.errors import SandboxUnavailableError
from workers.builder import BuildRequest
from workers.mirrors import RepoCache, repo_key
from workers.outcomes import Outcome, Outcomes, parse, with_ids

logger = logging.getLogger(__name__)

RECORD_PREFIX = "baton:env:"
LOCK_PREFIX = "baton:env-lock:"
KEY_OF_PREFIX = "baton:env-of:"
"""`<prefix><repo hash>:<commit>:<spec hash>` → the environment key: a run's later stages find
their environment without reading the tree again."""
KEY_OF_TTL_S = 7 * 24 * 3600
FAILED_TTL_S = 600
"""How long a failed build's record stops other workers from building the same key again."""
LOCK_TTL_S = 60.0
"""How long the build lock lasts unless renewed: its holder renews it while it builds (a build
may take as long as it needs), so a builder that died — a SIGKILLed worker — frees it within
this."""
LOCK_WAIT_S = 3600
BUILDER_START_S = 120.0
"""How long a handed-over build may wait for a builder to take it (its build lock) before the
worker says that no builder serves its daemon."""
HANDOFF_POLL_S = 1.0
UNAVAILABLE_TTL_S = 30
"""How long a builder's record of a failing Docker daemon (retryable) stops others."""
TAIL_LINES = 40

Progress = Callable[[str], None]
Handoff = Callable[[BuildRequest, docker.DockerClient], None]


@dataclass(frozen=True)
class Environment:
    """A built, validated environment: what a code stage's sandbox starts from."""

    key: str
    tag: str
    spec: EnvironmentSpec
    test_command: str | None
    baseline: Outcomes
    built: bool = False
    """This call built it (else it was there already)."""
    commit: str | None = None
    """The commit whose tree the setup built (None: recorded before products were kept)."""
    products: tuple[str, ...] = ()
    """What the setup built in the workspace and the image keeps there (`sandbox.products`):
    each sandbox lays its commit over them."""
    build_log: str = ""
    test_log: str = ""


class BuildLock:
    """The fleet-wide lock on building one environment, for a `with` block.

    Held for `ttl_s` and renewed every third of it from a thread while the block runs, so that
    a build may take as long as it needs while a builder that dies without releasing it (a
    SIGKILLed worker) holds up the others for `ttl_s` at most.

    Raises:
        EnvironmentBuildError: the lock was not free within `wait_s`.
    """

    def __init__(
        self, client: redis.Redis, key: str, *, ttl_s: float = LOCK_TTL_S,
        wait_s: float = LOCK_WAIT_S,
    ) -> None:  # fmt: skip
        self.key = key
        self.ttl_s = ttl_s
        # Not thread-local: the renewing thread must see the token the acquiring one got.
        self._lock = client.lock(
            LOCK_PREFIX + key, timeout=ttl_s, blocking_timeout=wait_s, thread_local=False
        )
        self._wait_s = wait_s
        self._done = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="baton-build-lock", daemon=True)

    def __enter__(self) -> BuildLock:
        if not self._lock.acquire():
            raise EnvironmentBuildError(
                f"environment {self.key}: no build lock after {self._wait_s:.0f}s"
            )
        self._renewer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._renewer.join()
        try:
            self._lock.release()
        except redis.exceptions.LockError:
            logger.warning("environment %s: the build lock had expired", self.key)

    def _renew(self) -> None:
        while not self._done.wait(self.ttl_s / 3):
            try:
                self._lock.extend(self.ttl_s, replace_ttl=True)
            except redis.exceptions.RedisError as exc:  # lost, or Redis away: the next try
                logger.warning("environment %s: build lock not renewed: %s", self.key, exc)


class Environments:
    """Builds and finds environments for one worker; the fleet shares them through Redis."""

    def __init__(
        self,
        client: redis.Redis,
        mirrors: RepoCache,
        settings: BuildSettings | None = None,
        *,
        sandbox_config: SandboxConfig | None = None,
        docker_client: docker.DockerClient | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        self.redis: Any = client
        self.mirrors = mirrors
        self.settings = settings or BuildSettings()
        self.sandbox_config = sandbox_config or SandboxConfig()
        self.docker = docker_client
        self.handoff = handoff
        """Set: builds go to the builder this calls, never run here."""

    def prepare(
        self,
        repo: str,
        commit: str,
        *,
        spec: EnvironmentSpec | None = None,
        progress: Progress | None = None,
    ) -> Environment:
        """The environment of `repo` at `commit`: `spec`, or the one the tree holds or implies.
        Built and validated the first time its key is seen anywhere in the fleet.

        Raises:
            EnvironmentBuildError: a setup command failed (now, or in another worker's build).
            EnvironmentValidationError: the tests cannot even start in it.
            EnvironmentSpecError: the repository's spec is not valid.
            RepoError: the commit cannot be found.
            SandboxError: Docker failed.
        """
        say = progress or (lambda line: logger.info("%s", line))
        uid, gid = self.sandbox_config.uid_gid
        with connected(self.docker) as client:
            key_of = _key_of(repo, commit, spec)
            key = self.redis.get(key_of)
            if key is not None:
                found = self._found(client, key)
                if found is not None:
                    return found
            tree = self.mirrors.archive(repo, commit, uid=uid, gid=gid)
            base_id = _image_id(client, self.settings.base_image) or ""
            given = spec
            version = self.mirrors.version(repo, commit) if spec is None else None
            spec, key = _spec_and_key(tree, spec, base_id, repo_key(repo), version)
            self.redis.set(key_of, key, ex=KEY_OF_TTL_S)
            found = self._found(client, key)
            if found is not None:
                return found
            if self.handoff is not None:
                say(f"environment {key} is not built yet: handing it to the builder")
                self.handoff(BuildRequest(repo, commit, given, key), client)
                return self._awaited(client, key)
            say(f"environment {key} is not built yet: taking its build lock")
            with BuildLock(self.redis, key):
                found = self._found(client, key)  # built by another worker while we waited
                if found is not None:
                    return found
                return self._build(client, key, spec, tree, repo, commit, say)

    def prune(self, *, older_than_s: float, dry_run: bool = False) -> list[str]:
        """Remove the environments (image and record) not used for `older_than_s`; the keys."""
        cutoff, removed = time.time() - older_than_s, []
        with connected(self.docker) as client:
            for key in self.keys():
                fields = self.record(key) or {}
                used = float(fields.get("last_used") or fields.get("built_at") or 0)
                if used > cutoff:
                    continue
                removed.append(key)
                if dry_run:
                    continue
                tag = fields.get("tag")
                if tag and tag != self.settings.base_image:
                    try:
                        client.api.remove_image(tag, force=True)
                    except docker.errors.ImageNotFound:
                        pass
                self.redis.delete(RECORD_PREFIX + key)
        return removed

    def record(self, key: str) -> dict[str, str] | None:
        fields: dict[str, str] = self.redis.hgetall(RECORD_PREFIX + key)
        return fields or None

    def keys(self) -> list[str]:
        return sorted(
            k.removeprefix(RECORD_PREFIX) for k in self.redis.scan_iter(match=RECORD_PREFIX + "*")
        )

    def record_failure(self, key: str, repo: str, error: str, *, retryable: bool) -> None:
        """Tell the workers waiting for `key` why its builder could not build it: they raise
        `SandboxUnavailableError` for a `retryable` failure (the builder's Docker daemon failed)
        until `UNAVAILABLE_TTL_S` has passed, `EnvironmentBuildError` for another one."""
        self._record_failure(key, repo, None, error, retryable=retryable)

    # -- helpers ------------------------------------------------------------------------------

    def _awaited(self, client: docker.DockerClient, key: str) -> Environment:
        """The environment `key` once the builder has recorded it; its failure raised."""
        started = time.monotonic()
        while True:
            found = self._found(client, key)
            if found is not None:
                return found
            waited = time.monotonic() - started
            if waited > LOCK_WAIT_S:
                raise EnvironmentBuildError(f"environment {key}: not built after {waited:.0f}s")
            if waited > BUILDER_START_S and not self.redis.exists(LOCK_PREFIX + key):
                raise SandboxUnavailableError(
                    f"environment {key}: no builder took its build within {BUILDER_START_S:.0f}s;"
                    " start `baton worker --builder` with the sandbox gate's build socket for "
                    "this Docker daemon (docs/security.md)"
                )
            time.sleep(HANDOFF_POLL_S)

    def _found(self, client: docker.DockerClient, key: str) -> Environment | None:
        """The recorded environment `key` if its image is here; raises its recorded failure."""
        fields = self.record(key)
        if not fields:
            return None
        if fields.get("status") == "failed":
            error = fields.get("error", f"environment {key} failed")
            if fields.get("retryable"):
                raise SandboxUnavailableError(error)
            raise EnvironmentBuildError(error)
        tag = fields["tag"]
        if _image_id(client, tag, missing_ok=True) is None:
            return None  # recorded by another host, or pruned here: build it (again)
        self.redis.hset(RECORD_PREFIX + key, "last_used", repr(time.time()))
        return Environment(
            key=key,
            tag=tag,
            spec=EnvironmentSpec.model_validate_json(fields["spec"]),
            test_command=fields.get("test_command") or None,
            baseline=_outcomes(json.loads(fields.get("baseline", "{}"))),
            commit=fields.get("commit") or None,
            products=tuple(json.loads(fields.get("products", "[]"))),
        )

    def _build(
        self,
        client: docker.DockerClient,
        key: str,
        spec: EnvironmentSpec,
        tree: bytes,
        repo: str,
        commit: str,
        say: Progress,
    ) -> Environment:
        tag = environment_tag(key)
        started = time.monotonic()
        products: tuple[str, ...] = ()
        try:
            if spec.packages or spec.setup:
                built = build_environment(
                    spec, tree, tag=tag, settings=self.settings, client=client, progress=say,
                    workspace=self.sandbox_config.workspace, user=self.sandbox_config.uid_gid,
                )  # fmt: skip
                image_id, size, log = built.image_id, built.size_bytes, built.log
                products = built.products
            else:  # nothing to install: the base image is the environment
                tag, log = self.settings.base_image, ""
                image_id = _image_id(client, tag) or ""
                size = int(client.api.inspect_image(tag)["Size"])
            command = with_ids(spec.test) if spec.test else None
            baseline, test_log = Outcomes(), ""
            if command is not None:
                say(f"environment {key}: validating with {command}")
                ran = validate_environment(
                    tag, spec, tree, test_command=command, config=self.sandbox_config,
                    timeout_s=self.settings.test_timeout_s, client=client,
                )  # fmt: skip
                baseline, test_log = parse(ran.output), ran.output
                if not baseline.by_id and ran.exit_code != 0:
                    if tag != self.settings.base_image:
                        client.api.remove_image(tag, force=True)
                    raise EnvironmentValidationError(
                        f"environment {key}: the tests cannot start: {command!r} exited with "
                        f"{ran.exit_code} and named no test:\n{_tail(ran.output)}"
                    )
        except (EnvironmentBuildError, EnvironmentValidationError) as exc:
            self._record_failure(key, repo, spec, str(exc))
            raise
        self.redis.hset(
            RECORD_PREFIX + key,
            mapping={
                "status": "ok",
                "key": key,
                "tag": tag,
                "repo": repo,
                "spec": spec.model_dump_json(),
                "image_id": image_id,
                "size_bytes": str(size),
                "built_at": repr(time.time()),
                "last_used": repr(time.time()),
                "build_s": str(round(time.monotonic() - started, 2)),
                "test_command": command or "",
                "commit": commit,
                "products": json.dumps(products),
                "baseline": json.dumps({k: v.value for k, v in baseline.by_id.items()}),
                "passed": str(len(baseline.passed)),
                "failed": str(len(baseline.failed)),
                "skipped": str(len(baseline.skipped)),
            },
        )
        say(
            f"environment {key}: {len(baseline.passed)} tests pass and {len(baseline.failed)} "
            "fail on the unchanged code"
        )
        return Environment(
            key=key, tag=tag, spec=spec, test_command=command, baseline=baseline, built=True,
            commit=commit, products=products, build_log=log, test_log=test_log,
        )  # fmt: skip

    def _record_failure(
        self, key: str, repo: str, spec: EnvironmentSpec | None, error: str, *,
        retryable: bool = False,
    ) -> None:  # fmt: skip
        record = RECORD_PREFIX + key
        fields = {"status": "failed", "key": key, "repo": repo, "error": error,
                  "built_at": repr(time.time())}  # fmt: skip
        if spec is not None:
            fields["spec"] = spec.model_dump_json()
        if retryable:
            fields["retryable"] = "1"
        with self.redis.pipeline() as pipe:
            pipe.delete(record)
            pipe.hset(record, mapping=fields)
            pipe.expire(record, UNAVAILABLE_TTL_S if retryable else FAILED_TTL_S)
            pipe.execute()


def given_spec(run: RunRecord) -> EnvironmentSpec | None:
    """The spec `baton enqueue --env` gave `run` (checked there), or None: the repository's."""
    given = run.environment_spec
    return from_table(given, origin="the run's environment spec") if given else None


def _key_of(repo: str, commit: str, spec: EnvironmentSpec | None) -> str:
    repo_hash = repo_key(repo)
    spec_hash = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16] if spec else "-"
    return f"{KEY_OF_PREFIX}{repo_hash}:{commit}:{spec_hash}"


def _spec_and_key(
    tree: bytes,
    spec: EnvironmentSpec | None,
    base_id: str,
    repository: str,
    version: str | None = None,
) -> tuple[EnvironmentSpec, str]:
    """`spec`, or the one the tree holds or implies, and its key; read from the tree's regular
    files only (symlinks are not followed, so nothing outside the tree is read)."""
    with tempfile.TemporaryDirectory(prefix="baton-env-") as folder:
        root = Path(folder)
        unpack_files(tree, root)
        spec = spec or detect(root, version=version)
        return spec, environment_key(spec, root, base_id, repository=repository)


def unpack_files(tree: bytes, dest: Path) -> None:
    """The tree's regular files and folders under `dest` (a git tree holds no absolute path
    and no `..`; the `data` filter checks it again where Python has it, from 3.11.4)."""
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        members = [m for m in archive.getmembers() if m.isfile() or m.isdir()]
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, members=members, filter="data")
        else:  # Debian bookworm's Python 3.11.2, in the service image
            for member in members:
                if member.name.startswith("/") or ".." in Path(member.name).parts:
                    raise ValueError(f"the repository's tree holds a path {member.name!r}")
            archive.extractall(dest, members=members)


def _image_id(client: docker.DockerClient, tag: str, *, missing_ok: bool = False) -> str | None:
    with translated(f"looking for the image {tag}", image=tag):
        try:
            found: str = client.api.inspect_image(tag)["Id"]
        except docker.errors.ImageNotFound:
            if missing_ok:
                return None
            raise
    return found


def _outcomes(by_id: dict[str, str]) -> Outcomes:
    return Outcomes({k: Outcome(v) for k, v in by_id.items()}, "recorded" if by_id else None)


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])

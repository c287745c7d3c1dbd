"""A worker's warm pool: started, hardened, idle sandboxes for the environments it used lately,
so that a stage does not wait for a container to start.

    pool = WarmPool(size=2)
    with pool.start(cfg, labels={"baton.run": run_id}, env=variables) as box:
        ...                                   # a container started before it was asked for

Each container serves one execution and is removed after it, as a cold one is; the pool
starts a replacement in the background. It keeps `size` ready containers for each of the
`max_configs` configurations (image, limits, variables) used most recently, removes those idle
longer than `idle_s`, and starts none for a configuration no execution asked for lately.

Pooled containers carry the sandbox labels the reaper reads (`baton.sandbox`, `baton.owner`,
and a `baton.expires` that leaves a taken one its whole `ttl_s`) plus `baton.pool`. Labels
cannot be added to a container once created, so a taken one is renamed for the execution that
took it (`sandbox.labels.container_name`): `remove_labelled` and `docker ps --filter name=<run>`
find it by that name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import docker

from sandbox import labels as label
from sandbox.client import connect, remove, translated
from sandbox.config import SandboxConfig
from sandbox.docker import DockerSandbox, _create
from sandbox.errors import SandboxError

logger = logging.getLogger(__name__)

POOL_LABEL = "baton.pool"

PoolKey = tuple[SandboxConfig, tuple[tuple[str, str], ...]]


class WarmPool:
    """Ready sandboxes per recently used configuration; see the module's documentation."""

    def __init__(
        self,
        *,
        size: int = 2,
        max_configs: int = 4,
        idle_s: float = 600.0,
        client: docker.DockerClient | None = None,
    ) -> None:
        self.size, self.max_configs, self.idle_s = size, max_configs, idle_s
        self._client = client
        """Connected, and the refilling thread started, at the first `start` (a worker that
        never runs a code stage needs no Docker daemon)."""
        self._ready: dict[PoolKey, deque[tuple[str, float]]] = {}
        self._wanted: OrderedDict[PoolKey, None] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def start(
        self, cfg: SandboxConfig, *, labels: Mapping[str, str], env: Mapping[str, str]
    ) -> Iterator[DockerSandbox]:
        """A ready sandbox for `cfg` and `env` if the pool has one, else a new one started now;
        removed when the block ends either way."""
        key: PoolKey = (cfg, tuple(sorted(env.items())))
        client = self._running()
        container_id = self._take(client, key, labels)
        if container_id is None:
            with DockerSandbox.start(cfg, labels=labels, env=env, client=client) as box:
                yield box
            return
        try:
            yield DockerSandbox(client, cfg, container_id)
        finally:
            remove(client, container_id)

    def ready(self) -> int:
        """How many containers wait in the pool now."""
        with self._lock:
            return sum(len(found) for found in self._ready.values())

    def close(self) -> None:
        """Stop refilling and remove every waiting container."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            waiting = [cid for found in self._ready.values() for cid, _ in found]
            self._ready.clear()
        if self._client is not None:
            for container_id in waiting:
                remove(self._client, container_id)

    # -- helpers ------------------------------------------------------------------------------

    def _running(self) -> docker.DockerClient:
        """The pool's client, connected on first use, and its refilling thread started."""
        with self._lock:
            if self._client is None:
                self._client = connect()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._refill_forever, name="baton-pool", daemon=True
                )
                self._thread.start()
            return self._client

    def _take(
        self, client: docker.DockerClient, key: PoolKey, labels: Mapping[str, str]
    ) -> str | None:
        """A ready container for `key`, renamed for the execution `labels` name; None if the
        pool has none (or the one it had is gone)."""
        with self._lock:
            self._wanted[key] = None
            self._wanted.move_to_end(key)
            while len(self._wanted) > self.max_configs:
                self._wanted.popitem(last=False)
            found = self._ready.get(key)
            taken = found.popleft()[0] if found else None
        self._wake.set()
        if taken is None:
            return None
        try:
            with translated(f"naming pooled sandbox {taken[:12]}"):
                client.api.rename(taken, label.container_name(labels))
        except SandboxError as exc:  # killed while it waited, say: start one cold instead
            logger.warning("pooled sandbox %s could not be taken: %s", taken[:12], exc)
            remove(client, taken)
            return None
        return taken

    def _refill_forever(self) -> None:
        client = connect()  # the pool's own connection: this thread's calls never interleave
        try:
            while not self._closed.is_set():
                self._wake.wait(timeout=min(30.0, self.idle_s / 2))
                self._wake.clear()
                try:
                    self._refill(client)
                except SandboxError as exc:
                    logger.warning("the sandbox pool could not refill: %s", exc)
                    self._closed.wait(5.0)
        finally:
            client.close()

    def _refill(self, client: docker.DockerClient) -> None:
        now = time.monotonic()
        stale: list[str] = []
        with self._lock:
            for key, found in self._ready.items():
                fresh: deque[tuple[str, float]] = deque()
                for container_id, started in found:
                    if key in self._wanted and now - started < self.idle_s:
                        fresh.append((container_id, started))
                    else:
                        stale.append(container_id)
                self._ready[key] = fresh
            missing = [(key, self.size - len(self._ready.get(key, ()))) for key in self._wanted]
        for container_id in stale:
            remove(client, container_id)
        for key, count in missing:
            for _ in range(max(0, count)):
                if self._closed.is_set():
                    return
                container_id = self._start_idle(client, key)
                with self._lock:
                    self._ready.setdefault(key, deque()).append((container_id, time.monotonic()))

    def _start_idle(self, client: docker.DockerClient, key: PoolKey) -> str:
        cfg, env = key
        # A taken container must still have its whole ttl_s: it may have waited idle_s first.
        waiting = cfg.model_copy(update={"ttl_s": cfg.ttl_s + int(self.idle_s) + 1})
        return _create(client, waiting, {POOL_LABEL: "1"}, dict(env))

"""Where a code stage works: a workspace holding the run's pinned commit, from a factory.

`execute_stage` asks a `Sandboxes` factory for a workspace and never knows what is behind it.
Baton's factory is `DockerSandboxes`: a fresh, hardened Docker sandbox per execution, the
commit's tree copied in from the host's mirror of the repository. Tests use an in-process one
(`testkit.sandboxes.LocalSandboxes`) through the same protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import sandbox
from orchestrator.core.execution import Held
from sandbox.build import agent_config, tree_paths
from sandbox.pool import WarmPool
from workers import metrics
from workers.baseline import Baselines
from workers.environments import Environment
from workers.mirrors import RepoCache
from workers.rebuild import BuildRun, Rebuild, collisions, excluded
from workers.timings import COPY_IN, SANDBOX_START, SANDBOX_STOP, Entered, timed
from workers.tools.container import ContainerWorkspace
from workers.tools.workspace import TEST_BYPRODUCTS, Workspace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkspaceRequest:
    """What one execution's workspace must hold and how it is contained."""

    repo: str
    commit: str
    stage: str
    """The stage it is for (metrics, logs)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels that find the workspace again (`execution_labels`)."""
    network: str | None = None
    """A named network the workspace may reach; None: no network at all."""
    environment: Environment | None = None
    """The run's environment: its image, variables and limits; None: the plain sandbox
    image."""
    on_build: Callable[[BuildRun], None] | None = field(default=None, compare=False)
    """Told of each run of the environment's build step (`workers.rebuild`) in the workspace."""


class Sandboxes(Protocol):
    """Opens a workspace at a commit for one execution and removes it afterwards."""

    def open(self, request: WorkspaceRequest) -> AbstractContextManager[Workspace]:
        """A workspace holding `request.commit` of `request.repo`, with `git diff` showing what
        changed since; gone when the block ends.

        Raises:
            sandbox.SandboxError: no workspace could be made (retryable or not, by subclass).
            RepoError: the commit cannot be found.
        """
        ...


class DockerSandboxes:
    """A fresh Docker sandbox per workspace, hardened by `config`, the tree copied in from
    the host's mirror of the repository."""

    def __init__(
        self,
        mirrors: RepoCache,
        config: sandbox.SandboxConfig,
        *,
        pool: WarmPool | None = None,
        build_timeout_s: float = 1800.0,
    ) -> None:
        self.mirrors = mirrors
        self.config = config
        self.pool = pool
        """Ready containers to take instead of starting one (None: each is started cold)."""
        self.build_timeout_s = build_timeout_s
        """Most time one command of the environment's build step may take."""
        self.baselines = Baselines()
        """The workspaces' baseline commits, made on this host (`workers.baseline`)."""

    @contextmanager
    def open(self, request: WorkspaceRequest) -> Iterator[Workspace]:
        config, env = self.config, request.environment
        if env is not None:
            config = agent_config(config, env.tag, env.spec)
        if request.network:
            config = type(config).model_validate(
                {**config.model_dump(), "network": request.network}
            )
        uid, gid = config.uid_gid
        over = env.commit if env is not None and env.products else None
        products = env.products if env is not None else ()
        with timed(COPY_IN):
            tree = self.mirrors.archive(request.repo, request.commit, uid=uid, gid=gid, over=over)
            tracked = tree_paths(tree)
            ignored, forced = excluded(products, tracked)
            tree = self.baselines.with_baseline(
                tree, commit=request.commit, ignored=(*TEST_BYPRODUCTS, *ignored), tracked=forced,
                objects=self.mirrors.objects(request.repo), uid=uid, gid=gid,
            )  # fmt: skip
        variables = dict(env.spec.env) if env is not None else {}
        if self.pool is not None:
            started = self.pool.start(config, labels=dict(request.labels), env=variables)
        else:
            started = sandbox.DockerSandbox.start(
                config, labels=dict(request.labels), env=variables
            )
        timed_start = Entered(started, start=SANDBOX_START, stop=SANDBOX_STOP)
        with metrics.sandbox_lifetime(request.stage, timed_start) as box:
            with timed(COPY_IN):
                in_the_way = collisions(products, tracked)
                if in_the_way:
                    box.exec(["rm", "-rf", "--", *(f"{config.workspace}/{p}" for p in in_the_way)])
                box.put_archive(config.workspace, tree)
            workspace = ContainerWorkspace(
                box, root=config.workspace, rebuild=self._rebuild(request)
            )
            logger.info(
                "sandbox %s ready for %s (%d bytes of tree)", box.id[:12], request.stage, len(tree)
            )
            yield workspace

    def _rebuild(self, request: WorkspaceRequest) -> Rebuild | None:
        """The environment's build step for this workspace; stale when the files it builds from
        differ between the image's commit and this one."""
        env = request.environment
        if env is None or not env.spec.build:
            return None
        changed = (
            None
            if env.commit is None
            else self.mirrors.changed(
                request.repo, env.commit, request.commit, env.spec.build_inputs
            )
        )
        return Rebuild(
            env.spec.build,
            env.spec.build_inputs,
            stale=changed is None or bool(changed),
            timeout_s=self.build_timeout_s,
            on_build=request.on_build,
        )


def execution_labels(held: Held, attempt: int) -> dict[str, str]:
    """The labels of the sandboxes one execution starts (`WorkspaceRequest.labels`), which
    find them again: `baton.run`, `baton.stage`, a branch's `baton.branch`, `baton.attempt`.
    Removing by all of them removes that execution's sandboxes and no one else's: not a sibling
    branch's, nor those of a later execution that took the stage or branch over."""
    labels = {"baton.run": held.run_id, "baton.stage": held.stage}
    if held.branch is not None:
        labels["baton.branch"] = held.branch
    return {**labels, "baton.attempt": str(attempt)}


def remove_sandboxes(labels: Mapping[str, str]) -> None:
    """Remove the sandboxes carrying all of `labels` at once (a cancelled stage's), saying so
    in the log when the daemon cannot."""
    try:
        sandbox.remove_labelled(dict(labels))
    except sandbox.SandboxError as exc:
        logger.warning("could not remove the sandboxes labelled %s: %s", dict(labels), exc)

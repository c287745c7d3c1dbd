"""Where a code stage works: a fresh sandbox holding the run's pinned commit, with the changes
of the stages before it applied. What the stage changes leaves as the `workspace.diff`
artifact, which carries its work to the stages after it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sandbox
from orchestrator.conductor import branch_label, session_id
from orchestrator.models import ArtifactRef, RunRecord
from orchestrator.pipeline import Pipeline, StageSpec
from orchestrator.store import RunStore
from workers import metrics
from workers.errors import StageError
from workers.mirrors import RepoCache
from workers.tools.code import DIFF_ARTIFACT
from workers.tools.container import ContainerWorkspace
from workers.tools.errors import ToolError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageJob:
    """Everything one execution of one stage needs."""

    run: RunRecord
    pipeline: Pipeline
    spec: StageSpec
    attempt: int
    owner: str = ""
    """The execution holding the stage (`<host>:<pid>:<task id>`)."""

    @property
    def labels(self) -> dict[str, str]:
        return {
            "branch": branch_label(self.run.pipeline, self.spec.name),
            "session": session_id(self.run.id, self.spec.name, self.attempt),
            "stage": self.spec.name,
        }


class StoreArtifacts:
    """The artifact sink of one stage: artifacts land in the run store under `<stage>/`."""

    def __init__(self, store: RunStore, run_id: str, stage: str) -> None:
        self._store, self._run_id, self._stage = store, run_id, stage
        self.saved: dict[str, ArtifactRef] = {}

    def save(self, name: str, data: bytes, media_type: str = "text/plain") -> str:
        ref = self._store.put_artifact(self._run_id, f"{self._stage}/{name}", data, media_type)
        self.saved[name] = ref
        return ref.uri


@contextmanager
def open_workspace(
    job: StageJob, *, store: RunStore, repos: RepoCache, config: sandbox.SandboxConfig
) -> Iterator[ContainerWorkspace]:
    """A sandbox for this execution: the pinned commit, plus the upstream stages' changes."""
    if job.spec.sandbox_network:
        config = type(config).model_validate(
            {**config.model_dump(), "network": job.spec.sandbox_network}
        )
    uid, gid = config.uid_gid
    tree = repos.archive(job.run.repo, job.run.commit, uid=uid, gid=gid)
    labels = {
        "baton.run": job.run.id,
        "baton.stage": job.spec.name,
        "baton.attempt": str(job.attempt),
    }
    with metrics.sandbox_lifetime(
        job.spec.name, sandbox.DockerSandbox.start(config, labels=labels)
    ) as box:
        box.put_archive(config.workspace, tree)
        workspace = ContainerWorkspace(box, root=config.workspace)
        workspace.commit_baseline()
        upstream = upstream_diff(job)
        if upstream is not None:
            _apply(workspace, store.artifact(upstream).decode(), upstream, job)
        logger.info(
            "sandbox %s ready for %s of run %s (%d bytes of tree)",
            box.id[:12], job.spec.name, job.run.id, len(tree),
        )  # fmt: skip
        yield workspace


def upstream_diff(job: StageJob) -> ArtifactRef | None:
    """The newest `workspace.diff` recorded by a stage before this one."""
    for stage in job.pipeline.before(job.spec.name):
        record = job.run.stages.get(stage.name)
        if record and DIFF_ARTIFACT in record.artifacts:
            return record.artifacts[DIFF_ARTIFACT]
    return None


def _apply(workspace: ContainerWorkspace, diff: str, ref: ArtifactRef, job: StageJob) -> None:
    if not diff.strip():
        return
    try:
        workspace.apply_patch(diff)
    except ToolError as exc:
        raise StageError(
            f"the changes of an earlier stage ({ref.uri}) do not apply to "
            f"{job.run.commit[:12]}: {exc.message}"
        ) from exc

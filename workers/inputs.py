"""What one execution of a stage reads, resolved into one value before it starts.

The stage task reads the run store once, up front (`resolve`): the seed state (the issue digest
and the upstream outputs the instruction references), the command it verifies with, the change
the stages before it made, and the proof a publishing stage quotes. `workers.stage.execute_stage`
then needs no store at all, so a test (or a replay) can hand it any `StageInputs` it likes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.execution import branch_label, session_id
from orchestrator.models import RunRecord
from orchestrator.pipeline import ISSUE_KEY, Pipeline, StageSpec
from orchestrator.store import RunStore
from workers import proof
from workers.environments import Environment
from workers.errors import StageError
from workers.tools.code import DIFF_ARTIFACT


@dataclass(frozen=True)
class StageInputs:
    """Everything one execution of one stage reads."""

    run_id: str
    pipeline: str
    """The pipeline's name (or path), for labels."""
    spec: StageSpec
    attempt: int
    repo: str
    """Where the code is (a path or URL), for code stages and publishing."""
    commit: str
    """The commit pinned when the run was enqueued."""
    state: Mapping[str, Any] = field(default_factory=dict)
    """The session's seed state: the issue digest and the upstream outputs the stage's
    instruction references, by key."""
    verify_command: str | None = None
    """The test command Baton runs before and after the stage's work (`spec.verify`)."""
    upstream_diff: str | None = None
    """The change the stages before this one made, applied to its workspace first."""
    evidence: str = ""
    """What a publishing stage adds to its pull request: the tests Baton measured."""
    planned_files: tuple[str, ...] | None = None
    """The files a publishing stage's change is meant to touch (`spec.publish.planned_from`);
    None: no file counts as unplanned."""
    environment: Environment | None = None
    """The run's environment, for a code stage's sandbox (the worker prepares it)."""

    @property
    def labels(self) -> dict[str, str]:
        """The tags of this execution's audit entries."""
        return {
            "branch": branch_label(self.pipeline, self.spec.name),
            "session": session_id(self.run_id, self.spec.name, self.attempt),
            "stage": self.spec.name,
        }


def resolve(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, attempt: int, store: RunStore
) -> StageInputs:
    """Read what the stage needs from the run and its store.

    Raises:
        StageError: the stage verifies with a command an earlier stage did not give.
    """
    wanted = [key for key in spec.inputs if key != ISSUE_KEY]
    state: dict[str, Any] = store.outputs(run.id, wanted)
    if ISSUE_KEY in spec.inputs:
        state[ISSUE_KEY] = run.issue.digest()
    return StageInputs(
        run_id=run.id,
        pipeline=run.pipeline,
        spec=spec,
        attempt=attempt,
        repo=run.repo,
        commit=run.commit,
        state=state,
        verify_command=_verify_command(run, spec, store),
        upstream_diff=_upstream_diff(run, pipeline, spec, store),
        evidence=_evidence(run, pipeline, spec, store),
        planned_files=_planned_files(run, spec, store),
    )


def _verify_command(run: RunRecord, spec: StageSpec, store: RunStore) -> str | None:
    if spec.verify is None:
        return None
    key, name = spec.verify.source
    command = (store.output(run.id, key) or {}).get(name)
    if not isinstance(command, str) or not command.strip():
        raise StageError(f"stage {key!r} gave no {name!r} to verify {spec.name!r} with")
    return command


def _planned_files(run: RunRecord, spec: StageSpec, store: RunStore) -> tuple[str, ...] | None:
    source = spec.publish.source if "publish" in spec.tools else None
    if source is None:
        return None
    key, name = source
    files = (store.output(run.id, key) or {}).get(name)
    if not isinstance(files, list) or not all(isinstance(path, str) for path in files):
        raise StageError(
            f"stage {key!r} gave no list {name!r} of the files {spec.name!r} may change"
        )
    return tuple(files)


def _upstream_diff(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore
) -> str | None:
    """The newest change recorded by a stage before this one (code stages only)."""
    if not spec.tools:
        return None
    for stage in pipeline.before(spec.name):
        record = run.stages.get(stage.name)
        if record and DIFF_ARTIFACT in record.artifacts:
            return store.artifact(record.artifacts[DIFF_ARTIFACT]).decode()
    return None


def _evidence(run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore) -> str:
    """The measured tests of the newest earlier stage that verifies, for a publishing stage."""
    if "publish" not in spec.tools:
        return ""
    for stage in pipeline.before(spec.name):
        if stage.verify:
            return proof.evidence(stage.schema_class(), store.output(run.id, stage.output_key))
    return ""

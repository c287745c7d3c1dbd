"""What one execution of a stage reads, resolved into one value before it starts.

The stage task reads the run store once, up front (`resolve`): the seed state (the issue digest
and the upstream outputs the instruction references), the command it verifies with, the change
the stages before it made, and the proof a publishing stage quotes. `workers.stage.execute_stage`
then needs no store at all, so a test (or a replay) can hand it any `StageInputs` it likes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from orchestrator.core.branches import BRANCH_KEY, ITEM_KEY, map_source
from orchestrator.core.execution import Held
from orchestrator.core.facts import Fact, Proof, Reproduction, recorded
from orchestrator.core.git import redact
from orchestrator.core.models import RunRecord
from orchestrator.core.pipeline import (
    CHANGE_KEY,
    ISSUE_KEY,
    PREVIOUS_ATTEMPT_KEY,
    Pipeline,
    StageSpec,
)
from orchestrator.core.reported import ReportedFailure, reported_failure
from orchestrator.core.store import RunStore
from orchestrator.core.tools import BUILTIN_TOOLS, CommandTool, ToolDeclaration, ToolRun
from workers import proof
from workers.changes import ChangePolicy
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
    base: str | None = None
    """The commit the run's change is measured against, when it is about one."""
    source: str = "text"
    """Where the run's issue came from (`IssueSource`), for the tools that ask for the run."""
    source_id: str | None = None
    """The issue's id at its source (`owner/repo#number`), for the same."""
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
    iteration: int = 1
    """Which iteration of a looped stage this is."""
    reproduction: Reproduction | None = None
    """The reproducing test of the stage that reproduced the report, as that stage's spec reads
    its output, for a stage that proves its change (`spec.proof`)."""
    suite_command: str | None = None
    """The repository's own test command, which a proof runs before and after the change; the
    worker takes it from the run's environment."""
    publishable: ChangePolicy | None = None
    """What the stage's proof holds its change to besides its tests: the `publish` rule of the
    stage its `proof.publishable_by` names, with the planned files resolved; None: nothing."""
    reported: ReportedFailure | None = None
    """The failure the run's report shows (its exception type and where it was raised), which a
    reproducing test's failure is held to and a proven change may not trade for another error;
    None: the report shows none, or the stage neither reproduces nor proves."""
    tools: Mapping[str, ToolDeclaration] = field(default_factory=dict)
    """The declarations of the pipeline's tools this stage names (built-in ones have none)."""
    branch: str | None = None
    """The branch of a fan-out stage this execution runs (`b1` … `bN`); None: the stage."""

    @property
    def held(self) -> Held:
        """What this execution holds: the stage, or one of its branches."""
        return Held(self.run_id, self.spec.name, self.branch)

    @property
    def needs_workspace(self) -> bool:
        """Whether the stage works in a sandbox (it has code or command tools)."""
        return works_in_sandbox(self.spec, self.tools)

    def in_environment(self, environment: Environment | None) -> StageInputs:
        """These inputs for a code stage in the run's environment: its image for the sandbox,
        its test command for the proof."""
        command = environment.test_command if environment is not None else None
        return replace(self, environment=environment, suite_command=command)

    def with_change(self, diff: str) -> StageInputs:
        """These inputs with the change under review in the seed state (`{change}`), cut to
        `MAX_CHANGE_CHARS`."""
        return replace(self, state={**self.state, CHANGE_KEY: change_text(diff)})

    def tool_run(self) -> ToolRun:
        """The run, as a host tool that asks for it (`ToolRun`) is told of it."""
        return ToolRun(
            run_id=self.run_id, pipeline=self.pipeline, stage=self.spec.name,
            repo=redact(self.repo), commit=self.commit, base=self.base, source=self.source,
            source_id=self.source_id,
        )  # fmt: skip

    @property
    def labels(self) -> dict[str, str]:
        """The tags of this execution's audit entries."""
        return {
            "branch": self.held.label(self.pipeline),
            "session": self.held.session_id(self.attempt),
            "stage": self.spec.name,
        }


def resolve(
    run: RunRecord,
    pipeline: Pipeline,
    spec: StageSpec,
    attempt: int,
    store: RunStore,
    *,
    branch: str | None = None,
) -> StageInputs:
    """Read what the stage (or its `branch`) needs from the run and its store. A branch reads
    the same as its stage, and its own id as `{branch}`.

    Raises:
        StageError: the stage verifies with a command an earlier stage did not give.
    """
    wanted = [
        key
        for key in spec.inputs
        if key not in (ISSUE_KEY, CHANGE_KEY, PREVIOUS_ATTEMPT_KEY, BRANCH_KEY, ITEM_KEY)
    ]
    state: dict[str, Any] = store.outputs(run.id, wanted)
    if ISSUE_KEY in spec.inputs:
        state[ISSUE_KEY] = run.issue.digest()
    if BRANCH_KEY in spec.inputs:
        state[BRANCH_KEY] = branch
    if ITEM_KEY in spec.inputs:
        state[ITEM_KEY] = _item(run, spec, branch, store)
    iteration = run.stages[spec.name].iteration if spec.name in run.stages else 1
    if PREVIOUS_ATTEMPT_KEY in spec.inputs:
        previous = store.output(run.id, spec.output_key) if iteration > 1 else None
        ended = [i for i in run.stages[spec.name].iterations if i.number == iteration - 1]
        said = ended[-1].reason if ended and ended[-1].reason else None
        state[PREVIOUS_ATTEMPT_KEY] = (
            previous_attempt(spec, previous, iteration - 1, reason=said)
            if previous is not None
            else None
        )
    return StageInputs(
        run_id=run.id,
        pipeline=run.pipeline,
        spec=spec,
        attempt=attempt,
        repo=run.repo,
        commit=run.commit,
        base=run.base,
        source=run.issue.source.value,
        source_id=run.issue.source_id,
        state=state,
        verify_command=_verify_command(run, spec, store),
        upstream_diff=_upstream_diff(run, pipeline, spec, store),
        evidence=_evidence(run, pipeline, spec, store),
        planned_files=_planned_files(run, spec, store),
        publishable=_publishable(run, pipeline, spec, store),
        iteration=iteration,
        reported=(
            reported_failure(run.issue)
            if spec.reproduce is not None or spec.proof is not None
            else None
        ),
        reproduction=_reproduction(run, pipeline, spec, store),
        tools={name: pipeline.tools[name] for name in spec.tools if name in pipeline.tools},
        branch=branch,
    )


def _item(run: RunRecord, spec: StageSpec, branch: str | None, store: RunStore) -> Any:
    """The item of its upstream list a `map` stage's branch works on (`{item}`).

    Raises:
        StageError: the execution is no branch of a `map`, or the list no longer holds it.
    """
    record = run.stages.get(spec.name)
    fan = record.fan_in if record is not None else None
    index = fan.branches[branch].item if fan is not None and branch in fan.branches else None
    key, field = map_source(spec)
    items = (store.output(run.id, key) or {}).get(field)
    if index is None or not isinstance(items, list) or index >= len(items):
        raise StageError(f"stage {spec.name!r} reads {{{ITEM_KEY}}}, but {spec.map} holds no "
                         f"item for branch {branch}")  # fmt: skip
    return items[index]


def works_in_sandbox(spec: StageSpec, declarations: Mapping[str, ToolDeclaration]) -> bool:
    """Whether a stage with these tool declarations needs a sandbox: a built-in (code) tool or
    a command tool does; host tools and MCP servers run outside it."""
    return any(
        name in BUILTIN_TOOLS or isinstance(declarations.get(name), CommandTool)
        for name in spec.tools
    )


def _verify_command(run: RunRecord, spec: StageSpec, store: RunStore) -> str | None:
    if spec.verify is None:
        return None
    key, name = spec.verify.source
    command = (store.output(run.id, key) or {}).get(name)
    if not isinstance(command, str) or not command.strip():
        raise StageError(f"stage {key!r} gave no {name!r} to verify {spec.name!r} with")
    return command


def _publishable(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore
) -> ChangePolicy | None:
    name = spec.proof.publishable_by if spec.proof is not None else None
    if name is None:
        return None
    publishing = pipeline.stage(name)
    return ChangePolicy.of(_planned_files(run, publishing, store), publishing.publish.allow)


def _planned_files(run: RunRecord, spec: StageSpec, store: RunStore) -> tuple[str, ...] | None:
    sources = spec.publish.sources if "publish" in spec.tools else []
    if not sources:
        return None
    files: list[str] = []
    for key, name in sources:
        listed = (store.output(run.id, key) or {}).get(name)
        if not isinstance(listed, list) or not all(isinstance(path, str) for path in listed):
            raise StageError(
                f"stage {key!r} gave no list {name!r} of the files {spec.name!r} may change"
            )
        files += listed
    return tuple(dict.fromkeys(files))


def _reproduction(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore
) -> Reproduction | None:
    """The reproducing test a proving stage runs, read through its reproducing stage's rule.

    Raises:
        StageError: the run has no reproduction Baton measured, or it does not read as one.
    """
    if spec.proof is None:
        return None
    key = spec.proof.reproduction_from
    found = store.output(run.id, key)
    try:
        reproduction = pipeline.producing(key).reproduction(found) if found else None
    except ValidationError as exc:
        raise StageError(f"the reproduction {key!r} does not read as one: {exc}") from exc
    if reproduction is None or reproduction.measured is None:
        raise StageError(
            f"stage {spec.name!r} proves its change with the reproduction {key!r}, which the "
            "run does not have"
        )
    return reproduction


def _upstream_diff(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore
) -> str | None:
    """The newest change recorded by a stage before this one (code stages only)."""
    if not works_in_sandbox(spec, pipeline.tools):
        return None
    return newest_change(run, pipeline, spec, store)


def newest_change(
    run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore
) -> str | None:
    """The newest change a stage before `spec` recorded, as a diff; None when none did."""
    for stage in pipeline.before(spec.name):
        record = run.stages.get(stage.name)
        if record and DIFF_ARTIFACT in record.artifacts:
            return store.artifact(record.artifacts[DIFF_ARTIFACT]).decode()
    return None


def _evidence(run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore) -> str:
    """The measured tests of the newest earlier stage that verifies or proves, for a publishing
    stage.

    Raises:
        StageError: that stage proves its change, and its proof did not pass: nothing short of
            a passing proof is published.
    """
    if "publish" not in spec.tools:
        return ""
    for stage in pipeline.before(spec.name):
        if stage.verify or stage.proof:
            output = store.output(run.id, stage.output_key)
            if stage.proof:
                verdict = recorded(stage.schema_class(), output, Fact.PROOF, Proof)
                if verdict is None or not verdict.passed:
                    said = verdict.reason if verdict else "no proof was recorded"
                    raise StageError(
                        f"the change of stage {stage.name!r} is not proven ({said}), so it is "
                        "not published"
                    )
            return proof.evidence(stage.schema_class(), output) + _reviewed(
                run, pipeline, spec, store
            )
    return ""


def _reviewed(run: RunRecord, pipeline: Pipeline, spec: StageSpec, store: RunStore) -> str:
    """What the stages that judged the change before `spec` (a `send_back` rule) said of it:
    a line for the pull request, below the proof's."""
    lines = []
    for stage in pipeline.before(spec.name):
        rule = stage.send_back
        output = store.output(run.id, stage.output_key) if rule is not None else None
        if rule is None or output is None:
            continue
        judged = " and ".join(f"`{path}`" for path in rule.unless)
        if rule.holds(output):
            lines.append(f"- reviewed in a fresh session by stage `{stage.name}`: {judged} hold")
        else:  # published over it: a person approved at the gate its refusal opened
            lines.append(f"- stage `{stage.name}` refused it ({rule.reason(output)}); a person "
                         "approved it at the gate")  # fmt: skip
    return "\n" + "\n".join(lines) if lines else ""


MAX_CHANGE_CHARS = 24_000
"""The most of the change under review a stage's instruction holds (`{change}`); a longer diff
is cut in the middle, with a marker saying how much, and the stage reads the rest from its
workspace."""


def change_text(diff: str) -> str:
    """The change under review as a stage reads it: the diff, or its head and tail with a
    marker where `MAX_CHANGE_CHARS` cut it; a note when there is no change at all."""
    if not diff.strip():
        return "(the change is empty: the head and the base hold the same files)"
    if len(diff) <= MAX_CHANGE_CHARS:
        return diff
    half = MAX_CHANGE_CHARS // 2
    cut = len(diff) - 2 * half
    marker = (f"\n[… {cut:,} characters of the diff cut here; read the changed files in the "
              "workspace …]\n")  # fmt: skip
    return diff[:half] + marker + diff[-half:]


PREVIOUS_ATTEMPT_CHARS = 2_500
"""The most a looped stage's summary of its previous iteration may hold."""


def previous_attempt(
    spec: StageSpec, output: Mapping[str, Any], number: int, *, reason: str | None = None
) -> str:
    """What iteration `number + 1` of a looped stage is told about iteration `number`: why it
    was not accepted (`reason`, as its record says, else the loop's reason field), what it said
    it did, what it changed, which tests failed and the tail of their output; never its
    conversation. At most `PREVIOUS_ATTEMPT_CHARS`, the output's tail cut first."""
    assert spec.loop is not None
    verdict = recorded(spec.schema_class(), output, Fact.PROOF, Proof)
    lines = [
        f"Your previous attempt (iteration {number} of {spec.loop.max_iterations}) was not "
        f"accepted: {reason or spec.loop.reason(output)}",
    ]
    said = spec.loop.summary(output)
    if said:
        lines.append(f"It said of itself: {said[:300]}")
    if verdict is None:
        return "\n".join(lines)[:PREVIOUS_ATTEMPT_CHARS]
    if verdict.diff_stat:
        lines.append(f"Its change (Baton discarded it; you start again from the plan):\n"
                     f"{verdict.diff_stat}")  # fmt: skip
    for ids, what in (
        (verdict.still_failing, "Reproducing tests that still failed"),
        (verdict.passed_before, "Reproducing tests that passed even without it"),
        (verdict.pass_to_fail, "Tests that passed before and failed with it"),
    ):
        if ids:
            lines.append(f"{what}: {', '.join(ids[:10])}")
    head = "\n".join(lines)
    tail = verdict.failure_tail
    room = PREVIOUS_ATTEMPT_CHARS - len(head) - 60
    if tail and room > 200:
        head += f"\nThe end of their output:\n```\n{tail[-room:]}\n```"
    return head[:PREVIOUS_ATTEMPT_CHARS]

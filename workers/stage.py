"""Execute one stage: a plain function of its inputs, callable without Celery, Redis or Docker.

`execute_stage` takes the stage's resolved inputs (`workers.inputs.StageInputs`), sinks for what
it produces (artifacts, audit entries, model usage), a factory of workspaces for code stages
(`workers.sandboxes.Sandboxes`) and a fence it calls before anything that shows outside. It
runs the stage's agent once in a fresh session, validates the reply (one repair turn), has
Baton itself run the verification command before and after, run a reproducing stage's test on
the unchanged code and prove a proving stage's change (both in clean workspaces,
`workers.proof`), and holds the output to its size budget. Fields the output schema declares as
measured (`orchestrator.core.facts.Measured`) are filled from what Baton measured, whatever the
model said; the fields Baton reads of an output are the ones the stage's spec names.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.tools.base_tool import BaseTool
from pydantic import BaseModel, ValidationError

from orchestrator.core.children import Children
from orchestrator.core.facts import Fact, Proof, Reproduced, TestRun, measured_fields
from orchestrator.core.pipeline import StageSpec
from orchestrator.core.subsessions import Lineage
from orchestrator.core.tools import BUILTIN_TOOLS
from workers import output as outputs
from workers import proof
from workers.agent import AgentSpec, AuditSink, StageSession, Usage, build_agent
from workers.budget import json_chars
from workers.changes import ChangePolicy
from workers.delegate import Delegation, delegate_tool, without_delegate
from workers.errors import (
    ProofFailedError,
    PublishError,
    StageError,
    StageOutputError,
    TestsFailedError,
)
from workers.inputs import StageInputs
from workers.publish import Publisher
from workers.rebuild import BuildRun
from workers.sandboxes import Sandboxes, WorkspaceRequest, execution_labels
from workers.subsessions import BRANCH, SESSION
from workers.tools.artifacts import ArtifactSink
from workers.tools.code import DIFF_ARTIFACT, build_tools
from workers.tools.declared import ToolBench, open_toolbox
from workers.tools.errors import ToolError
from workers.tools.model import StageToolModel
from workers.tools.secrets import Secrets
from workers.tools.workspace import Workspace

logger = logging.getLogger(__name__)

OnBuild = Callable[[BuildRun], None]

__all__ = ["Fence", "StageOutput", "StageSinks", "execute_stage"]

WRITE_TOOLS = frozenset({"edit_file", "apply_patch"})
REPAIR_MODEL_CALLS = 2
COMPACTOR = "compactor"
MAX_VERIFY_TIMEOUT_S = 300.0

Fence = Callable[[], None]
"""Raises (`StageCancelledError`, `LeaseLostError`) when the execution must stop; called at
every model and tool call and right before every side effect that shows outside the run."""


def _open_fence() -> None:
    """The fence of an execution nothing can stop (a test's, a replay's)."""


@dataclass
class StageSinks:
    """Where an execution's products go. The caller owns them, so what an execution made
    before it failed (its test logs, its model calls) is still there to record."""

    artifacts: ArtifactSink
    audit: AuditSink
    usage: Usage = field(default_factory=Usage)
    requests: list[dict[str, Any]] | None = None
    """Every model request as sent, when the caller keeps them (`BATON_KEEP_MODEL_REQUESTS`);
    None: not kept."""
    children: Children | None = None
    """Where the sessions of the run's kept children are kept (`workers.delegate`); None: no
    child can be kept (an execution outside a run)."""


@dataclass(frozen=True)
class StageOutput:
    """The validated output of one execution."""

    output: dict[str, Any]
    compacted: str | None = None
    """How an over-budget output was brought within budget: `summarized` or `truncated`."""


async def execute_stage(
    inputs: StageInputs,
    *,
    model: BaseLlm,
    sinks: StageSinks,
    sandboxes: Sandboxes | None = None,
    publisher: Publisher | None = None,
    fence: Fence = _open_fence,
    checkpoint: Fence | None = None,
    streaming: bool = False,
    environ: Mapping[str, str] | None = None,
    summarizer: BaseLlm | None = None,
    handoff: Callable[[], None] | None = None,
) -> StageOutput:
    """Run the stage's agent once, validate (one repair turn), verify and size its output.

    A stage with code or command tools works in a workspace from `sandboxes`; a stage with the
    `publish` tool publishes through `publisher`. `fence` is called right before every push;
    `checkpoint` (by default `fence`) at every model and tool call. `environ` is where its
    declared tools' secrets are read (the worker's environment). `summarizer` writes the
    summaries of a stage with `compaction` when it names another model than the stage's.
    `handoff` is called before each subagent starts (the run's budget counts hand-offs).

    Raises:
        ExecutionError: a subclass saying why the stage has no output (see `workers.errors`).
    """
    spec = inputs.spec
    schema = spec.schema_class()
    facts: dict[Fact, Any] = {}
    change = ""
    on_build = _build_recorder(inputs, sinks.artifacts)
    with _workspace(inputs, sandboxes, on_build) as workspace:
        if workspace is not None and inputs.verify_command:
            facts[Fact.TESTS_BEFORE] = _verify(inputs, workspace, sinks.artifacts, "before")
        bench = ToolBench(
            stage=spec.name,
            workspace=workspace,
            builtins=_tools(inputs, workspace, sinks.artifacts, facts, publisher, fence),
            environ=environ or {},
            command_timeout_s=_command_timeout_s(spec),
            model=_tool_models(inputs, model, sinks, checkpoint or fence),
            run=inputs.tool_run(),
            record=facts.__setitem__,
        )
        async with open_toolbox(without_delegate(spec.tools), inputs.tools, bench) as toolbox:
            tools = toolbox.tools + _delegation(
                inputs, bench, model, sinks, checkpoint or fence, streaming, handoff
            )
            agent = build_agent(
                AgentSpec(
                    name=spec.name,
                    instruction=spec.instruction,
                    contract=outputs.contract(schema),
                    budget=spec.budget,
                    tools=tools,
                    review_tool_result=toolbox.review,
                    json_reply=not tools,
                    checkpoint=checkpoint or fence,
                    record_request=_recorder(sinks),
                    compaction=spec.compaction,
                    summarizer=summarizer,
                    audit=lambda entries: sinks.audit([{**inputs.labels, **e} for e in entries]),
                ),
                model,
                sinks.usage,
            )
            async with StageSession.open(
                agent,
                session_id=inputs.labels["session"],
                state=inputs.state,
                audit=sinks.audit,
                labels=inputs.labels,
                usage=sinks.usage,
                streaming=streaming,
            ) as session:
                result = await _reply(session, spec, schema)
        if workspace is not None and inputs.verify_command:
            facts[Fact.TESTS_AFTER] = _verify(inputs, workspace, sinks.artifacts, "after")
        if workspace is not None and WRITE_TOOLS & set(spec.tools):
            change = workspace.diff()
            sinks.artifacts.save(DIFF_ARTIFACT, change.encode(), "text/x-diff")
    _require_passing_tests(spec, facts)
    if spec.reproduce:
        facts[Fact.REPRODUCED] = _reproduce(
            inputs, result, change, sandboxes, sinks.artifacts, on_build
        )
    if spec.proof is not None:
        facts[Fact.PROOF] = _prove(inputs, change, sandboxes, sinks.artifacts, on_build, publisher)
    result, compacted = await _fit_budget(result, inputs, schema, model, sinks, streaming)
    result = _with_facts(result, facts, schema)
    logger.info(
        "stage %s of run %s: %d model calls, %d prompt tokens, output %d chars",
        spec.name, inputs.run_id, sinks.usage.requests, sinks.usage.prompt_tokens_total,
        json_chars(result),
    )  # fmt: skip
    return StageOutput(output=result, compacted=compacted)


def _request(inputs: StageInputs, on_build: OnBuild) -> WorkspaceRequest:
    return WorkspaceRequest(
        repo=inputs.repo,
        commit=inputs.commit,
        stage=inputs.spec.name,
        labels=execution_labels(inputs.held, inputs.attempt),
        network=inputs.spec.sandbox_network,
        environment=inputs.environment,
        on_build=on_build,
    )


def _build_recorder(inputs: StageInputs, artifacts: ArtifactSink) -> OnBuild:
    """Saves the log of each run of the build step in the stage's workspaces as an artifact
    (`build-<n>.log`) and logs its time."""
    runs = itertools.count(1)

    def record(ran: BuildRun) -> None:
        number = next(runs)
        artifacts.save(f"build-{number}.log", ran.log.encode())
        outcome = "ok" if ran.failed_command is None else f"failed ({ran.failed_command})"
        logger.info("build %d of %s in run %s: %s in %.1fs", number, inputs.spec.name,
                    inputs.run_id, outcome, ran.duration_s)  # fmt: skip

    return record


@contextmanager
def _workspace(
    inputs: StageInputs, sandboxes: Sandboxes | None, on_build: OnBuild
) -> Iterator[Workspace | None]:
    """A workspace at the pinned commit with the upstream change applied, for a stage with
    code or command tools; none for one without."""
    if not inputs.needs_workspace:
        yield None
        return
    if sandboxes is None:
        raise StageError(f"stage {inputs.spec.name!r} has tools but was given no sandboxes")
    with sandboxes.open(_request(inputs, on_build)) as workspace:
        if inputs.upstream_diff and inputs.upstream_diff.strip():
            try:
                workspace.apply_patch(inputs.upstream_diff)
            except ToolError as exc:
                raise StageError(
                    f"the changes of an earlier stage do not apply to {inputs.commit[:12]}: "
                    f"{exc.message}"
                ) from exc
        yield workspace


async def _reply(session: StageSession, spec: StageSpec, schema: type[BaseModel]) -> dict[str, Any]:
    text = await session.turn(
        f"Do the {spec.name} stage now.", max_model_calls=spec.budget.max_model_calls
    )
    try:
        return outputs.parse(text, schema)
    except StageOutputError as first:
        logger.info("stage %s output invalid, one repair turn: %s", spec.name, first.message)
        text = await session.turn(outputs.repair_message(first), max_model_calls=REPAIR_MODEL_CALLS)
    try:
        return outputs.parse(text, schema)
    except StageOutputError as second:
        raise StageOutputError(
            f"stage {spec.name!r} output is invalid after one repair turn: {second.message}"
        ) from second


def _verify(
    inputs: StageInputs, workspace: Workspace, artifacts: ArtifactSink, when: str
) -> TestRun:
    """Run the stage's verification command; the measured result, its log an artifact."""
    assert inputs.verify_command is not None
    timeout_s = min(MAX_VERIFY_TIMEOUT_S, inputs.spec.budget.soft_time_limit_s / 4)
    run, log = proof.run_tests(workspace, inputs.verify_command, timeout_s=timeout_s)
    artifacts.save(f"tests-{when}.log", log.encode())
    logger.info("tests %s %s of run %s: %s", when, inputs.spec.name, inputs.run_id,
                proof.describe(run))  # fmt: skip
    return run


def _clean(inputs: StageInputs, sandboxes: Sandboxes | None, on_build: OnBuild) -> proof.OpenClean:
    """Opens a fresh workspace of the run's environment at the pinned commit, nothing applied:
    where Baton measures a change, away from the sandbox that made it."""
    if sandboxes is None:
        raise StageError(f"stage {inputs.spec.name!r} measures a change but has no sandboxes")
    request = _request(inputs, on_build)
    return lambda: sandboxes.open(request)


def _proof_timeout_s(spec: StageSpec) -> float:
    return min(MAX_VERIFY_TIMEOUT_S, spec.budget.soft_time_limit_s / 6)


def _reproduce(
    inputs: StageInputs,
    result: dict[str, Any],
    change: str,
    sandboxes: Sandboxes | None,
    artifacts: ArtifactSink,
    on_build: OnBuild,
) -> Reproduced:
    """Baton runs the reproducing tests the stage named (in the fields its `reproduce` rule
    names) on the unchanged code."""
    try:
        test = inputs.spec.reproduction(result)
    except ValidationError as exc:
        raise StageOutputError(f"the reproduction does not read as one: {exc}") from exc
    measured = proof.check_reproduction(
        _clean(inputs, sandboxes, on_build),
        change=change,
        command=test.command,
        expected_failure=test.failure,
        test_files=test.files,
        timeout_s=_proof_timeout_s(inputs.spec),
        artifacts=artifacts,
        reported=inputs.reported,
    )
    logger.info("run %s reproduced: %s failed as expected", inputs.run_id,
                measured.failed_tests or measured.command)  # fmt: skip
    return measured


def _prove(
    inputs: StageInputs,
    change: str,
    sandboxes: Sandboxes | None,
    artifacts: ArtifactSink,
    on_build: OnBuild,
    publisher: Publisher | None = None,
) -> Proof:
    """Baton's verdict on the stage's change (held to the publishing stage's rule too, when its
    proof names one); without a loop to try again, a failed one ends the stage."""
    assert inputs.spec.proof is not None and inputs.reproduction is not None
    suite = inputs.suite_command if inputs.spec.proof.suite else None
    refused = (
        _publish_refusal(inputs, change, publisher, inputs.publishable)
        if change.strip() and inputs.publishable is not None
        else None
    )
    if not change.strip():
        verdict = Proof(passed=False, reason="the stage changed nothing", reproducing_command="")
    elif refused is not None:  # no test run can make it publishable
        verdict = Proof(
            passed=False,
            reason=f"the change would not be published: {refused}",
            reproducing_command=inputs.reproduction.command,
            diff_stat=proof.diff_stat(change),
        )
    else:
        verdict = proof.prove(
            _clean(inputs, sandboxes, on_build),
            change=change,
            command=inputs.reproduction.command,
            test_files=inputs.reproduction.files,
            suite_command=suite,
            timeout_s=_proof_timeout_s(inputs.spec),
            artifacts=artifacts,
            reproduced=(
                inputs.reproduction.measured.failed_tests if inputs.reproduction.measured else ()
            ),
            reported=inputs.reported,
        )
    measured = inputs.reproduction.measured
    if measured is not None and measured.report_check:
        verdict = verdict.model_copy(update={"report_check": measured.report_check})
    logger.info("proof of %s of run %s (iteration %d): %s", inputs.spec.name, inputs.run_id,
                inputs.iteration, verdict.reason)  # fmt: skip
    if not verdict.passed and inputs.spec.loop is None:
        raise ProofFailedError(f"the change is not proven: {verdict.reason}")
    return verdict


def _publish_refusal(
    inputs: StageInputs, change: str, publisher: Publisher | None, policy: ChangePolicy
) -> str | None:
    """Why the publishing stage would refuse `change`, as it would check it; None if it would
    not. Without a publisher to check with, the stage cannot keep its proof's promise."""
    if publisher is None:
        raise StageError(
            f"stage {inputs.spec.name!r} proves its change publishable, but this worker has no "
            "publisher to check it with"
        )
    with tempfile.TemporaryDirectory(prefix="baton-check-") as tmp:
        try:
            return publisher.refusal(
                repo=inputs.repo, commit=inputs.commit, diff=change.encode(), workdir=Path(tmp),
                policy=policy,
            )  # fmt: skip
        except PublishError as exc:
            raise StageError(
                f"could not check the change against the publishing rule: {exc}"
            ) from exc


def _require_passing_tests(spec: StageSpec, facts: dict[Fact, Any]) -> None:
    after = facts.get(Fact.TESTS_AFTER)
    if not (spec.verify and spec.verify.require_pass and isinstance(after, TestRun)):
        return
    if not proof.succeeded(after):
        before = facts.get(Fact.TESTS_BEFORE)
        was = proof.describe(before) if isinstance(before, TestRun) else "not run"
        raise TestsFailedError(
            f"the tests still fail after the change (`{after.command}`: {proof.describe(after)}; "
            f"before: {was}), so it is not handed on or published"
        )


def _with_facts(
    result: dict[str, Any], facts: dict[Fact, Any], schema: type[BaseModel]
) -> dict[str, Any]:
    """The output with the fields its schema declares measured filled from what Baton
    measured, in place of the model's."""
    known = {
        name: facts[fact].model_dump(mode="json")
        if isinstance(facts[fact], BaseModel)
        else facts[fact]
        for fact, name in measured_fields(schema).items()
        if fact in facts
    }
    if not known:
        return result
    try:
        return schema.model_validate({**result, **known}).model_dump(mode="json")
    except ValidationError as exc:
        raise StageOutputError(f"measured fields do not fit {schema.__name__}: {exc}") from exc


def _recorder(sinks: StageSinks) -> Callable[[dict[str, Any]], None] | None:
    return sinks.requests.append if sinks.requests is not None else None


def _tools(
    inputs: StageInputs,
    workspace: Workspace | None,
    artifacts: ArtifactSink,
    facts: dict[Fact, Any],
    publisher: Publisher | None,
    fence: Fence,
) -> list[Callable[..., Any]]:
    if workspace is None:
        return []

    def publish(title: str, body: str, diff: str) -> dict[str, Any]:
        if publisher is None:
            raise ToolError("publishing is not available to this stage")
        fence()  # nothing of a cancelled run is pushed
        with tempfile.TemporaryDirectory(prefix="baton-publish-") as tmp:
            published = publisher.publish(
                repo=inputs.repo,
                commit=inputs.commit,
                diff=diff.encode(),
                branch=f"baton/{inputs.run_id}",
                title=title,
                body=f"{body}\n\n{inputs.evidence}".strip(),
                workdir=Path(tmp),
                fence=fence,
                policy=ChangePolicy.of(inputs.planned_files, inputs.spec.publish.allow),
            )
        facts[Fact.PUBLISHED_BRANCH] = published.branch
        facts[Fact.PUBLISHED_COMMIT] = published.commit
        if published.pull_request_url:
            facts[Fact.PUBLISHED_URL] = published.pull_request_url
        answer = published.model_dump(mode="json")
        artifacts.save("published.json", json.dumps(answer).encode(), "application/json")
        return answer

    return build_tools(
        [name for name in inputs.spec.tools if name in BUILTIN_TOOLS],
        workspace,
        artifacts,
        test_timeout_s=_command_timeout_s(inputs.spec),
        publish=publish,
    )


def _command_timeout_s(spec: StageSpec) -> float:
    """The most one command of the stage's tools (its tests, a command tool) may run."""
    return min(300, spec.budget.soft_time_limit_s // 2)


def _delegation(
    inputs: StageInputs,
    bench: ToolBench,
    model: BaseLlm,
    sinks: StageSinks,
    checkpoint: Fence,
    streaming: bool,
    handoff: Callable[[], None] | None = None,
) -> list[BaseTool]:
    """The stage's `delegate` tool, if it names one (`workers.delegate`)."""
    rule = inputs.spec.delegate
    if rule is None:
        return []
    delegation = Delegation(
        rule=rule, stage=inputs.spec.name, stage_budget=inputs.spec.budget, model=model,
        usage=sinks.usage, audit=sinks.audit,
        open_tools=lambda names: open_toolbox(names, inputs.tools, bench),
        checkpoint=checkpoint, record_request=_recorder(sinks), streaming=streaming,
        run_id=inputs.run_id, children=sinks.children, handoff=handoff,
    )  # fmt: skip
    stage = Lineage(inputs.labels[SESSION], inputs.labels[BRANCH], 0, rule.max_depth)
    return [delegate_tool(delegation, stage)]


def _tool_models(
    inputs: StageInputs, model: BaseLlm, sinks: StageSinks, checkpoint: Fence
) -> Callable[[str, Secrets], StageToolModel]:
    """Makes the model a host tool asks for: the stage's own, within its budget and audit."""
    loop = asyncio.get_running_loop()

    def tool_model(tool: str, secrets: Secrets) -> StageToolModel:
        return StageToolModel(
            tool, model=model, usage=sinks.usage,
            max_model_calls=inputs.spec.budget.max_model_calls, audit=sinks.audit,
            labels=inputs.labels, secrets=secrets, loop=loop, checkpoint=checkpoint,
            record_request=_recorder(sinks),
        )  # fmt: skip

    return tool_model


async def _fit_budget(
    result: dict[str, Any],
    inputs: StageInputs,
    schema: type[BaseModel],
    model: BaseLlm,
    sinks: StageSinks,
    streaming: bool,
) -> tuple[dict[str, Any], str | None]:
    """An output over its budget is summarized by a model call, else cut with markers."""
    limit = inputs.spec.budget.max_output_chars
    if json_chars(result) <= limit:
        return result, None
    agent = build_agent(
        AgentSpec(
            name=COMPACTOR,
            instruction=(
                f"You shorten the output of a pipeline stage to at most {limit} characters of "
                "JSON. Keep the same fields and every fact a later stage needs: names, paths, "
                "line numbers, commands, decisions. Drop repetition and prose first."
            ),
            contract=outputs.contract(schema),
            budget=inputs.spec.budget.model_copy(update={"max_model_calls": 2}),
            json_reply=True,
            record_request=_recorder(sinks),
        ),
        model,
        sinks.usage,
    )
    labels = {**inputs.labels, "session": inputs.labels["session"] + ":compact"}
    try:
        async with StageSession.open(
            agent,
            session_id=labels["session"],
            state={},
            audit=sinks.audit,
            labels=labels,
            usage=sinks.usage,
            streaming=streaming,
        ) as session:
            text = await session.turn(json.dumps(result, ensure_ascii=False), max_model_calls=2)
        summary = outputs.parse(text, schema)
        if json_chars(summary) <= limit:
            return summary, "summarized"
        logger.info("summary of %s still over budget (%d chars)", inputs.spec.name,
                    json_chars(summary))  # fmt: skip
    except StageError as exc:
        logger.info("summarizing %s failed (%s); cutting instead", inputs.spec.name, exc)
    return outputs.truncate_to_budget(result, schema, limit), "truncated"

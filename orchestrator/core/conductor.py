"""What a run is and where it goes next: submit, begin a stage, record it, advance, end.

Every transition is one Redis transaction on the run record, and each one is idempotent: a
redelivered stage whose output is already recorded only advances the run, and a stage is
enqueued only by the transaction that moves it from `pending` to `queued`. Recording a stage's
output and deciding what comes next happen in the same transaction, so the hand-off from one
stage to the next costs one round of Redis writes and one broker message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from orchestrator.core import (
    approvals,
    autonomy,
    fanin,
    fanout,
    fanstop,
    gates,
    handoffs,
    judging,
    keys,
    resumption,
    transitions,
)
from orchestrator.core.execution import (
    Completion,
    Hold,
    StageFigures,
    StageResult,
    StageStart,
    StartAction,
    branch_label,
    session_id,
)
from orchestrator.core.models import (
    Issue,
    Iteration,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.pipeline import Pipeline, StageSpec
from orchestrator.core.queue import Dispatcher
from orchestrator.core.rules import LoopRule, SendBackRule
from orchestrator.core.runbudget import RunBudget, run_budget
from orchestrator.core.specs import load_pipeline, pipeline_of, stage_of
from orchestrator.core.store import RunStore
from orchestrator.core.transitions import Next

logger = logging.getLogger(__name__)


def _env_part(environment: Mapping[str, Any] | None) -> str:
    """What an environment spec given at enqueue adds to a run's idempotency key: the same
    issue run in another environment is another run."""
    if environment is None:
        return ""
    canonical = json.dumps(environment, sort_keys=True, separators=(",", ":"))
    return "|env:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _change_part(base: str | None, commit: str) -> str:
    """What a change under review adds to a run's idempotency key: the same pull request
    pushed again (another head, or another base) is another review."""
    return "" if base is None else f"|change:{base}..{commit}"


def new_run_id() -> str:
    """Sortable and readable: `20261129-190833-3fa2c1`."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class Conductor:
    """Moves runs through their pipelines."""

    def __init__(self, store: RunStore, dispatcher: Dispatcher) -> None:
        self.store = store
        self.dispatcher = dispatcher

    def submit(
        self,
        issue: Issue,
        *,
        repo: str,
        commit: str,
        pipeline: Pipeline | str,
        force: bool = False,
        environment: Mapping[str, Any] | None = None,
        base: str | None = None,
        budget: RunBudget | None = None,
    ) -> tuple[str, bool]:
        """Create a run of `pipeline` (loaded already, or its name or file) and enqueue its first
        stage; an issue seen before maps to its run. The run pins the pipeline: its name and
        digest in the record, its spec beside it. `environment`: a spec (a TOML table, checked
        already) to use instead of the repository's. `base`: the commit a change is measured
        against, when the run is about one (its head is `commit`). `budget`: limits that replace
        the pipeline's `[run_budget]` ones for this run.

        Returns the run id and whether a new run was created.
        """
        spec = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
        stages = {stage.name: StageRecord() for stage in spec.stages}
        stages[spec.first.name] = StageRecord(status=StageStatus.QUEUED, queued_at=time.time())
        fanin.open_fan(stages[spec.first.name], spec.first)
        run = RunRecord(
            id=new_run_id(),
            pipeline=spec.name,
            pipeline_hash=spec.digest,
            repo=repo,
            commit=commit,
            base=base,
            issue=issue,
            idempotency_key=(
                f"{issue.idempotency_key()}|{repo}|{spec.name}{_env_part(environment)}"
                f"{_change_part(base, commit)}"
            ),
            current_stage=spec.first.name,
            environment_spec=dict(environment) if environment is not None else None,
            budget=run_budget(spec, budget),
            stages=stages,
        )
        stored, created = self.store.create(run, force=force, pipeline_content=spec.content)
        if created:
            self.send(stored.id, spec.name, spec.first)
            logger.info("run %s created for %s (%s)", stored.id, issue.source.value, spec.name)
        else:
            logger.info("issue already has run %s; not enqueued again", stored.id)
        return stored.id, created

    def pipeline_of(self, run: RunRecord) -> Pipeline:
        """The pipeline `run` executes (`pipeline_of`)."""
        return pipeline_of(self.store, run)

    def stage_of(self, run: RunRecord, stage: str) -> StageSpec:
        """A stage of the pipeline `run` pinned, for routing (`stage_of`)."""
        return stage_of(self.store, run, stage)

    def begin(
        self, run_id: str, stage: str, *, owner: str, lease_s: float, max_interrupted: int
    ) -> StageStart:
        """Claim a delivered stage for execution, or say why not.

        A stage held by another execution whose lease is still fresh is `busy`: this delivery
        is a duplicate (a redelivery after the visibility timeout, say) and must not run.
        """

        def mutate(run: RunRecord, pipe: Any) -> StageStart:
            start = decide(run)
            self.audit(run, stage, start.attempt, "stage_begin", pipe=pipe,
                        action=start.action.value, owner=owner)  # fmt: skip
            return start

        def decide(run: RunRecord) -> StageStart:
            record = run.stages.setdefault(stage, StageRecord())
            now = time.time()
            if run.status.is_terminal:
                return StageStart(StartAction.DROP, run=run)
            if record.status == StageStatus.DONE:
                return StageStart(StartAction.ADVANCE, run=run)
            if record.status == StageStatus.RUNNING and record.owner != owner:
                if record.lease_until is not None and record.lease_until > now:
                    return StageStart(StartAction.BUSY, run=run)
                record.interrupted += 1
            if record.interrupted >= max_interrupted:
                return StageStart(StartAction.EXHAUSTED, run=run)
            record.attempts += 1
            record.status = StageStatus.RUNNING
            record.started_at, record.finished_at = now, None
            record.waiting_until = None
            record.error = None
            record.owner, record.lease_until = owner, now + lease_s
            record.session_id = session_id(run_id, stage, record.attempts)
            run.status, run.current_stage = RunStatus.RUNNING, stage
            return StageStart(StartAction.RUN, attempt=record.attempts, run=run)

        start: StageStart = self.store.transact(run_id, mutate)
        return start

    def renew(self, run_id: str, stage: str, *, owner: str, lease_s: float) -> Hold:
        """Extend the owner's lease on a running stage, if it still holds it; says where the
        execution stands."""

        def mutate(run: RunRecord, pipe: Any) -> Hold:
            hold = transitions.hold_of(run.status, run.stages.get(stage), owner)
            if hold == Hold.HELD:
                run.stages[stage].lease_until = time.time() + lease_s
            return hold

        hold: Hold = self.store.transact(run_id, mutate)
        return hold

    def hold(self, run_id: str, stage: str, *, owner: str) -> Hold:
        """Where an execution stands with its stage, read (not changed) in one round trip: the
        check before a side effect (a push, say)."""
        status, record = self.store.stage_state(run_id, stage)
        return transitions.hold_of(status, record, owner)

    def complete(
        self, run_id: str, stage: str, result: StageResult, *, owner: str | None = None
    ) -> Completion:
        """Record a stage's output and advance the run, in one transaction.

        Nothing is recorded once the run is cancelled (the stage is marked stopped instead)
        or, with `owner`, once another execution holds the stage: the check and the write are
        the same transaction, so no output lands after a cancel, whatever the timing.
        """
        payload = json.dumps(result.output, ensure_ascii=False, separators=(",", ":"))

        def mutate(run: RunRecord, pipe: Any) -> tuple[Completion, Next | None, RunRecord]:
            self.record_execution(run, pipe, result.figures)
            record = run.stages[stage]
            if record.status == StageStatus.DONE:
                return Completion.RECORDED, None, run  # recorded before: a redelivery
            if owner is not None and record.owner != owner:
                return Completion.LOST, None, run
            if run.status == RunStatus.CANCELLED:
                transitions.stop(record, result.figures)
                return Completion.CANCELLED, None, run
            if run.status.is_terminal:
                return Completion.LOST, None, run
            decision = self._record(run, pipe, stage, result, payload)
            decision = handoffs.counted(self.store.redis, run, pipe, decision, stage)
            return Completion.RECORDED, decision, run

        done, decision, run = self.store.transact(run_id, mutate)
        attempt = run.stages[stage].attempts
        if done == Completion.CANCELLED:
            self.audit(run, stage, attempt, "stage_stopped", owner=owner, output_dropped=True)
            return done
        if done == Completion.LOST:
            logger.info("not recording %s of run %s: %s no longer holds it", stage, run_id, owner)
            return done
        if decision is None:  # recorded by an earlier delivery
            self.advance(run_id, stage)
            return done
        self.carry_out(run, decision)
        return done

    def _record(
        self, run: RunRecord, pipe: Any, stage: str, result: StageResult, payload: str
    ) -> Next:
        """Within `complete`'s transaction: store the output, and decide what comes next."""
        pipeline = self.pipeline_of(run)
        spec, record = pipeline.stage(stage), run.stages[stage]
        pipe.hset(keys.outputs(run.id), spec.output_key, payload)
        transitions.record_figures(record, result.figures)
        record.finished_at, record.waiting_until, record.error = time.time(), None, None
        record.output_chars = len(payload)
        record.compacted = result.compacted
        record.lease_until = None
        refused = judging.apply(self.store, run, pipe, pipeline, stage, result.output)
        if refused is not None:  # a judge that named no branch that finished
            self.audit(run, stage, record.attempts, "stage_failed", pipe=pipe, error=refused)
            return transitions.fail(run, stage, refused)
        if spec.loop is not None:
            pipe.hset(keys.outputs(run.id), f"{spec.output_key}.{record.iteration}", payload)
            again = self._iterate(run, pipe, stage, spec.loop, result.output)
            if again is not None:
                return again
        if spec.send_back is not None and not spec.send_back.holds(result.output):
            return self._send_back(run, pipe, pipeline, stage, spec.send_back, result.output)
        record.status = StageStatus.DONE
        self.audit(run, stage, record.attempts, "stage_done", pipe=pipe, chars=len(payload))
        return self.after_done(run, pipe, pipeline, stage, result.output)

    def after_done(
        self, run: RunRecord, pipe: Any, pipeline: Pipeline, stage: str, output: dict[str, Any]
    ) -> Next:
        """Within the transaction that marked `stage` done with `output` (its own completion,
        or a fan-out stage's join): its stop rule, the autonomy the run has, its gate, or the
        next stage."""
        spec, record = pipeline.stage(stage), run.stages[stage]
        if spec.stop_when and spec.stop_when.matches(output):
            return transitions.decide(run, pipeline, stage, output)
        limit = autonomy.effect(
            pipeline, run.repo, stage, left_artifacts=bool(record.artifacts),
            output_of=lambda key: output if key == spec.output_key
            else self.store.output(run.id, key),
        )  # fmt: skip
        if limit is not None:
            self.audit(run, stage, record.attempts, "autonomy", pipe=pipe, reason=limit.reason)
        if limit is not None and limit.stop:
            return transitions.skip_rest(run, pipeline, stage, limit.reason)
        own = None if spec.fans_out else spec.gate  # a fan-out stage's branches were gated each
        rule = own or (limit.gate if limit is not None else None)
        if rule is not None:
            gate = gates.open_gate(run, stage, rule, artifacts=list(record.artifacts),
                                   now=time.time(), output_key=spec.output_key)  # fmt: skip
            self.audit(run, stage, record.attempts, "gate_opened", pipe=pipe,
                        gate=gates.gate_id(stage), approve=gate.approve)  # fmt: skip
            return Next()
        return transitions.decide(run, pipeline, stage, output)

    def _iterate(
        self, run: RunRecord, pipe: Any, stage: str, loop: LoopRule, output: dict[str, Any]
    ) -> Next | None:
        """Within `complete`'s transaction, for a looped stage: record the iteration that
        ended; when its condition does not hold, queue the next one (`Next(send=stage)`) or,
        once `max_iterations` have run, fail the run with the last one's reason. None: the
        condition holds and the stage is done."""
        record = run.stages[stage]
        passed = loop.holds(output)
        reason = "" if passed else loop.reason(output)
        record.iterations.append(
            Iteration(
                number=record.iteration, attempt=record.attempts, passed=passed, reason=reason,
                requests=record.requests, prompt_tokens_total=record.prompt_tokens_total,
                output_tokens=record.output_tokens, started_at=record.started_at,
                finished_at=record.finished_at,
            )
        )  # fmt: skip
        self.audit(run, stage, record.attempts, "iteration_done", pipe=pipe,
                    iteration=record.iteration, passed=passed, reason=reason)  # fmt: skip
        if passed:
            return None
        if record.iteration >= loop.max_iterations:
            error = f"{reason} (after {_iterations(record.iteration)})"
            record.status, record.error = StageStatus.FAILED, error
            run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{stage}: {error}", None
            self.audit(run, stage, record.attempts, "stage_failed", pipe=pipe, error=error)
            return Next(ended=True)
        record.iteration += 1
        record.status, record.queued_at, record.owner = StageStatus.QUEUED, time.time(), None
        run.current_stage = stage
        return Next(send=stage)

    def _send_back(
        self,
        run: RunRecord,
        pipe: Any,
        pipeline: Pipeline,
        stage: str,
        rule: SendBackRule,
        output: dict[str, Any],
    ) -> Next:
        """Within `complete`'s transaction, for a stage whose `send_back` judgement did not
        hold: the looped stage it judged did not pass its iteration after all. Queue that
        stage's next iteration, the stages from it to this one fresh (`Next(send=rule.to)`);
        once its iterations have run out, fail the run with the reason; with `then = "gate"`,
        park the run on this stage's gate instead."""
        record, target = run.stages[stage], run.stages[rule.to]
        loop = pipeline.stage(rule.to).loop
        assert loop is not None  # the pipeline's check: send_back names a looped stage
        why = rule.reason(output)
        reason = f"{stage} refused it: {why}"
        if target.iterations and target.iterations[-1].number == target.iteration:
            target.iterations[-1].passed, target.iterations[-1].reason = False, reason
        self.audit(run, stage, record.attempts, "sent_back", pipe=pipe, to=rule.to,
                   iteration=target.iteration, reason=reason)  # fmt: skip
        if rule.then == "gate":
            record.status = StageStatus.DONE
            key = pipeline.stage(stage).output_key
            gates.open_gate(run, stage, gates.GateRule(approve="diff"), now=time.time(),
                            artifacts=list(target.artifacts), output_key=key)  # fmt: skip
            self.audit(run, stage, record.attempts, "gate_opened", pipe=pipe,
                       gate=gates.gate_id(stage), approve="diff")  # fmt: skip
            return Next()
        if target.iteration >= loop.max_iterations:
            ran = _iterations(target.iteration)
            error = f"refused the change of {rule.to}: {why} (after {ran} of it)"
            self.audit(run, stage, record.attempts, "stage_failed", pipe=pipe, error=error)
            return transitions.fail(run, stage, error)
        target.iteration += 1
        names = [spec.name for spec in pipeline.stages]
        for name in names[names.index(rule.to) + 1 : names.index(stage) + 1]:
            again = run.stages[name] = transitions.fresh(run.stages.get(name))
            again.iteration = target.iteration  # its task id names the round: `<run>.review.2`
        target.status, target.queued_at, target.owner = StageStatus.QUEUED, time.time(), None
        run.current_stage = rule.to
        return Next(send=rule.to)

    def advance(self, run_id: str, completed: str) -> str | None:
        """Enqueue the stage after `completed`, or end the run. Safe to call more than once."""
        run = self.store.get(run_id)
        pipeline = self.pipeline_of(run)
        output = self.store.output(run_id, pipeline.stage(completed).output_key) or {}

        def mutate(run: RunRecord, pipe: Any) -> tuple[Next, RunRecord]:
            decision = transitions.decide(run, pipeline, completed, output)
            return handoffs.counted(self.store.redis, run, pipe, decision, completed), run

        decision, run = self.store.transact(run_id, mutate)
        return self.carry_out(run, decision, pipeline)

    def postpone(
        self,
        run_id: str,
        stage: str,
        *,
        delay_s: float,
        reason: str,
        rate_limited: bool = True,
        owner: str | None = None,
        figures: StageFigures | None = None,
    ) -> StageRecord | None:
        """Put a stage back to wait until now + delay before its next attempt (a 429, or a
        failure outside the stage when not `rate_limited`), recording what the ended attempt
        cost. None, and nothing changed, if the run has ended (cancelled while the stage ran)
        or, with `owner`, if that execution no longer holds the stage: the stage must then not
        be retried."""

        def mutate(run: RunRecord, pipe: Any) -> RunRecord | None:
            self.record_execution(run, pipe, figures)
            record = run.stages[stage]
            if run.status.is_terminal or (owner is not None and record.owner != owner):
                return None
            if figures is not None:
                transitions.record_figures(record, figures)
            record.status = StageStatus.WAITING
            record.waiting_until = time.time() + delay_s
            if rate_limited:
                record.rate_limit_wait_s = round(record.rate_limit_wait_s + delay_s, 3)
                record.rate_limit_retries += 1
            else:
                record.infrastructure_retries += 1
            record.error = reason
            run.status = RunStatus.WAITING
            return run

        run: RunRecord | None = self.store.transact(run_id, mutate)
        if run is None:
            logger.info(
                "not retrying %s of run %s: the run ended or another holds it", stage, run_id
            )
            return None
        record = run.stages[stage]
        self.audit(run, stage, record.attempts, "stage_waiting", delay_s=delay_s, reason=reason)
        return record

    def show_wait(self, run_id: str, stage: str, seconds: float, reason: str) -> None:
        """A running stage is about to sleep inside its execution (quota, cooldown): show it
        until when, while the stage stays running (unlike `postpone`, which gives the stage
        back to its queue). Never fails the stage."""

        def mutate(run: RunRecord, pipe: Any) -> None:
            record = run.stages[stage]
            if record.status == StageStatus.RUNNING:
                record.waiting_until, record.error = time.time() + seconds, f"waiting: {reason}"

        try:
            self.store.transact(run_id, mutate)
        except Exception:
            logger.warning("could not show the wait of %s of run %s", stage, run_id, exc_info=True)

    def fail(
        self,
        run_id: str,
        stage: str,
        error: str,
        *,
        owner: str | None = None,
        figures: StageFigures | None = None,
    ) -> None:
        """Fail a stage and end its run, keeping what the failed execution cost and left behind
        (`figures`: its model calls, tokens, test logs, diff). With `owner`, only if that
        execution still holds the stage (a lost execution that wakes up late changes nothing)."""

        def mutate(run: RunRecord, pipe: Any) -> RunRecord | None:
            self.record_execution(run, pipe, figures)
            record = run.stages.setdefault(stage, StageRecord())
            if run.status.is_terminal or (owner is not None and record.owner != owner):
                return None
            if figures is not None:
                transitions.record_figures(record, figures)
            record.status, record.finished_at, record.error = StageStatus.FAILED, time.time(), error
            record.lease_until = None
            if record.fan_in is not None:  # none of its branches starts or is joined now
                fanstop.stop_branches(record.fan_in, error, time.time())
            run.status, run.reason, run.current_stage = RunStatus.FAILED, f"{stage}: {error}", None
            return run

        run: RunRecord | None = self.store.transact(run_id, mutate)
        if run is None:
            logger.info("not failing %s of run %s: no longer held by %s", stage, run_id, owner)
            return
        self.audit(run, stage, run.stages[stage].attempts, "stage_failed", error=error)
        self.store.retire(run)

    def cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """End a run as cancelled. Queued and waiting stages will not run; a running stage is
        stopped by its worker at its next safe point. False if the run had already ended."""

        def mutate(run: RunRecord, pipe: Any) -> RunRecord | None:
            if run.status.is_terminal:
                return None
            for record in run.stages.values():
                if record.status in (StageStatus.QUEUED, StageStatus.WAITING):
                    record.status, record.waiting_until = StageStatus.CANCELLED, None
            run.status, run.reason, run.current_stage = RunStatus.CANCELLED, reason, None
            return run

        run: RunRecord | None = self.store.transact(run_id, mutate)
        if run is None:
            return False
        self.audit(run, "-", 0, "run_cancelled", reason=reason)
        self.store.retire(run)
        return True

    def stopped(
        self, run_id: str, stage: str, *, owner: str, figures: StageFigures | None = None
    ) -> None:
        """The owner stopped a running stage because its run was cancelled; what it cost and
        left behind is kept."""

        def mutate(run: RunRecord, pipe: Any) -> RunRecord:
            self.record_execution(run, pipe, figures)
            record = run.stages[stage]
            if record.owner == owner and record.status == StageStatus.RUNNING:
                transitions.stop(record, figures)
            return run

        run: RunRecord = self.store.transact(run_id, mutate)
        self.audit(run, stage, run.stages[stage].attempts, "stage_stopped", owner=owner)

    def resume(
        self,
        run_id: str,
        from_stage: str | None = None,
        *,
        pipeline: Pipeline | None = None,
        budget: RunBudget | None = None,
    ) -> str:
        """Run an ended run again (`orchestrator.core.resumption.resume`); the stage enqueued."""
        return resumption.resume(self, run_id, from_stage, pipeline=pipeline, budget=budget)

    def approve(
        self, run_id: str, gate: str | None = None, *, by: str,
        edit: Mapping[str, Any] | None = None,
    ) -> gates.Approval:  # fmt: skip
        """Approve a gate of the run (`orchestrator.core.approvals.approve`)."""
        return approvals.approve(self, run_id, gate, by=by, edit=edit)

    def reject(self, run_id: str, gate: str | None = None, *, by: str, reason: str) -> bool:
        """Reject a gate of the run (`orchestrator.core.approvals.reject`)."""
        return approvals.reject(self, run_id, gate, by=by, reason=reason)

    def time_out_gates(self, run_id: str, now: float) -> dict[str, str]:
        """Act on the run's overdue gates (`orchestrator.core.approvals.time_out`)."""
        return approvals.time_out(self, run_id, now)

    def carry_out(
        self, run: RunRecord, decision: Next, pipeline: Pipeline | None = None
    ) -> str | None:
        """Act on a decision, with the run as its transaction left it."""
        if decision.ended:
            self.store.retire(run)
        if decision.send is None:
            return None
        pipeline = pipeline or self.pipeline_of(run)
        spec = pipeline.stage(decision.send)
        self.send(run.id, pipeline.name, spec, run.stages[decision.send].iteration)
        return decision.send

    def send(self, run_id: str, pipeline: str, spec: StageSpec, iteration: int = 1) -> None:
        """Send a queued stage: its task, or one per branch of a fan-out stage."""
        if spec.fans_out:
            fanout.send_branches(self, run_id, pipeline, spec)
        else:
            self.dispatcher.send_stage(run_id, pipeline, spec, iteration)

    def record_execution(self, run: RunRecord, pipe: Any, figures: StageFigures | None) -> None:
        """What an ending execution leaves on its run whatever the transaction decides (they
        are what happened): its audit entries not yet written, and the environment it ran in."""
        if figures is None:
            return
        if figures.audit:
            self.store.queue_audit(pipe, run.id, figures.audit)
        if figures.environment:
            run.environment = figures.environment

    def audit(
        self, run: RunRecord, stage: str, attempt: int, kind: str, *, pipe: Any = None,
        **data: Any,
    ) -> None:  # fmt: skip
        """Append a transition to the run's audit log; with `pipe`, in that transaction."""
        entry = {
            "ts": repr(time.time()),
            "branch": branch_label(run.pipeline, stage),
            "session": session_id(run.id, stage, attempt),
            "kind": kind,
            "data": data,
        }
        if pipe is not None:
            self.store.queue_audit(pipe, run.id, [entry])
        else:
            self.store.audit(run.id, [entry])


def _iterations(count: int) -> str:
    """`1 iteration`, `3 iterations`: how many a looped stage ran, in a run's reason."""
    return f"{count} iteration" + ("s" if count > 1 else "")

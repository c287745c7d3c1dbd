"""A judge stage chooses a fan-out stage's result, against a real Redis: it reads the candidates
(the branches that ended done, by id, and nothing of the others), and the branch it names
becomes the stage's output and artifacts for every later stage."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from pydantic import BaseModel

from orchestrator.core import fanout
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import RunStateError
from orchestrator.core.execution import StageResult
from orchestrator.core.models import RunStatus, StageStatus
from orchestrator.core.pipeline import Pipeline
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

from .test_fanout_conductor import ISSUE, LEASE_S, REPRODUCE, SCHEMAS, begin, fix_result, headers


class Pick(BaseModel):
    """The judge's output: the branch it keeps, and why."""

    keep: str
    why: str


PIPELINE = Pipeline.model_validate(
    {"name": "judged", "stages": [
        {"name": "reproduce", "instruction": "{issue}", "output_schema": f"{SCHEMAS}:Reproduction",
         "tools": ["read_file", "edit_file"], "reproduce": REPRODUCE},
        {"name": "fix", "instruction": "{reproduce}", "output_schema": f"{SCHEMAS}:Fix",
         "tools": ["read_file", "edit_file"], "proof": {"reproduction_from": "reproduce"},
         "parallel": 3, "select": {"judge": "pick", "field": "keep"}},
        {"name": "pick", "instruction": "Keep the best of {fix}",
         "output_schema": f"{__name__}:Pick"},
        {"name": "pr", "instruction": "{fix}", "output_schema": f"{SCHEMAS}:Plan"},
    ]}
)  # fmt: skip


@pytest.fixture
def conductor(unit_redis_url: str, store: RunStore) -> Iterator[Conductor]:
    dispatcher = Dispatcher.connect(unit_redis_url, QueueConfig())
    yield Conductor(store, dispatcher)
    dispatcher.close()


def judged(conductor: Conductor, failed: tuple[str, ...] = ("b2",)) -> str:
    """A run whose three fix branches ended (those in `failed` failed): the judge is next."""
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", StageResult({"test_files": ["t.py"]}), owner="w0")
    for n in (1, 2, 3):
        branch = f"b{n}"
        begin(conductor, run_id, branch, f"w{n}")
        result = None if branch in failed else fix_result(run_id, branch, True, 100 * n)
        fanout.complete_branch(conductor, run_id, "fix", branch, result, owner=f"w{n}",
                               error="boom" if result is None else None)  # fmt: skip
    return run_id


def judge(conductor: Conductor, run_id: str, keep: object) -> None:
    conductor.begin(run_id, "pick", owner="j", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "pick", StageResult({"keep": keep, "why": "smaller"}), owner="j")


def test_the_judge_reads_only_the_finished_branches_and_its_choice_is_the_stage_s(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = judged(conductor)
    run = conductor.store.get(run_id)
    assert (run.stages["fix"].status, run.stages["pick"].status) == (
        StageStatus.DONE,
        StageStatus.QUEUED,
    )
    candidates = conductor.store.output(run_id, "fix")
    assert candidates is not None and sorted(candidates) == ["b1", "b3"]
    assert candidates["b3"]["summary"] == "b3"
    assert headers(redis_client, "baton.judged.pr") == []

    judge(conductor, run_id, "b3")
    run = conductor.store.get(run_id)
    assert conductor.store.output(run_id, "fix") == fix_result(run_id, "b3", True, 300).output
    assert conductor.store.output(run_id, "fix.candidates") == candidates
    assert run.stages["fix"].artifacts == fix_result(run_id, "b3", True, 300).figures.artifacts
    assert run.stages["fix"].fan_in is not None and run.stages["fix"].fan_in.selected == "b3"
    assert headers(redis_client, "baton.judged.pr") == [(f"{run_id}.pr", "baton.judged.pr")]


@pytest.mark.parametrize(
    ("keep", "said"), [("b2", "'b2'"), ("b7", "'b7'"), (3, "'3'"), ("b1; rm -rf /", "'b1; rm")]
)
def test_a_judge_that_names_no_finished_branch_fails_saying_what_it_could_choose(
    conductor: Conductor, redis_client: redis.Redis, keep: object, said: str
) -> None:
    run_id = judged(conductor)
    judge(conductor, run_id, keep)
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED and run.stages["pick"].status == StageStatus.FAILED
    assert run.reason is not None and run.reason.startswith(f"pick: the judge chose {said}")
    assert run.reason.endswith("it could choose b1, b3")
    assert headers(redis_client, "baton.judged.pr") == []


def test_with_no_branch_finished_no_judge_runs(
    conductor: Conductor, redis_client: redis.Redis
) -> None:
    run_id = judged(conductor, failed=("b1", "b2", "b3"))
    run = conductor.store.get(run_id)
    assert run.status == RunStatus.FAILED
    assert run.reason == "fix: no branch finished: b1: boom; b2: boom; b3: boom"
    assert headers(redis_client, "baton.judged.pick") == []


def test_a_run_resumed_at_its_judge_offers_the_candidates_again(conductor: Conductor) -> None:
    run_id = judged(conductor)
    candidates = conductor.store.output(run_id, "fix")
    judge(conductor, run_id, "b3")
    conductor.cancel(run_id)
    assert conductor.resume(run_id, "pick") == "pick"
    assert conductor.store.output(run_id, "fix") == candidates, "the judge reads them again"
    judge(conductor, run_id, "b1")
    assert conductor.store.output(run_id, "fix") == fix_result(run_id, "b1", True, 100).output
    assert conductor.store.output(run_id, "fix.candidates") == candidates


def test_a_fan_out_cancelled_while_its_branches_run_resumes_only_once_they_stopped(
    conductor: Conductor,
) -> None:
    run_id, _ = conductor.submit(ISSUE, repo="/r", commit="abc", pipeline=PIPELINE)
    conductor.begin(run_id, "reproduce", owner="w0", lease_s=LEASE_S, max_interrupted=3)
    conductor.complete(run_id, "reproduce", StageResult({"test_files": ["t.py"]}), owner="w0")
    begin(conductor, run_id, "b1", "w1")
    conductor.cancel(run_id)
    with pytest.raises(RunStateError, match=r"stage fix of run .* is still stopping"):
        conductor.resume(run_id)

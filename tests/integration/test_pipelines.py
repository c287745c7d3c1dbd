"""Pipelines as the unit of deployment, on real Celery worker subprocesses and the fake Gemini
server: two pipelines with a stage of the same name each on their own queues and workers (one
of them the `baton pipeline new` scaffold, run as it is), a run that keeps the version it
pinned while its spec is edited, a stage a worker cannot load failed with the reason, and the
workers' reconciler going on past a run whose record is corrupt."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from pydantic import SecretStr

from demo.runner import make_sample_repo
from orchestrator.control import api
from orchestrator.control.cli import main
from orchestrator.control.scaffold import scenario
from orchestrator.core import keys
from orchestrator.core.models import RunRecord, RunStatus, StageStatus
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.settings import Settings
from orchestrator.core.store import RunStore
from testkit import services
from testkit.gemini import FakeGemini
from testkit.services import worker_env

from .conftest import CANARY_KEY

TRIAGER_SCHEMAS = """from pydantic import BaseModel


class Urgency(BaseModel):
    priority: int


class Tags(BaseModel):
    tags: list[str]
"""
TRIAGER = """
name = "triager"

[[stages]]
name = "summarize"
output_schema = "triager.schemas:Urgency"
instruction = "TRIAGER: how urgent is this? {issue}"

[[stages]]
name = "tag"
output_schema = "triager.schemas:Tags"
instruction = "Tag it: {summarize}"
"""
GAMMA_SCHEMAS = """from pydantic import BaseModel


class Thing(BaseModel):
    x: int
"""
GAMMA = """
name = "gamma"

[[stages]]
name = "only"
queue = "baton.labeller.summarize"
output_schema = "gamma_only.schemas:Thing"
instruction = "Nothing here: {issue}"
"""
ORIGINAL, EDITED = "You label reports", "EDITED: You label reports"
SUMMARIZE_LATENCY_MS = 1500
"""Long enough to edit the labeller's spec while its first stage runs."""


@dataclass
class Fleet:
    settings: Settings
    store: RunStore
    fake: FakeGemini
    labeller: Path
    triager: Path
    gamma: Path
    repo: Path
    logs: Path
    stuck: str
    corrupt: str

    def enqueue(self, pipeline: Path, text: str) -> str:
        return api.enqueue(text, repo=str(self.repo), pipeline=str(pipeline),
                           settings=self.settings, force=True)  # fmt: skip

    def wait(self, run_id: str, timeout_s: float = 60.0) -> RunRecord:
        deadline = time.monotonic() + timeout_s
        while (run := self.store.get(run_id)).status.is_terminal is False:
            assert time.monotonic() < deadline, f"run {run_id} is still {run.status.value}"
            time.sleep(0.1)
        return run


def package(parent: Path, name: str, files: dict[str, str]) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    for file_name, text in files.items():
        (folder / file_name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def fleet(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("pipelines")
    url = redis_url.rsplit("/", 1)[0] + "/7"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    # The scaffold, as `baton pipeline new` writes it; another pipeline with a stage of the same
    # name; a third whose schemas only this process (the enqueuer) can import.
    made = CliRunner().invoke(main, ["pipeline", "new", "labeller", "--dir", str(work / "a")])
    assert made.exit_code == 0, made.output
    package(work / "b", "triager", {"__init__.py": "", "schemas.py": TRIAGER_SCHEMAS,
                                    "pipeline.toml": TRIAGER})  # fmt: skip
    package(work / "g", "gamma_only", {"__init__.py": "", "schemas.py": GAMMA_SCHEMAS,
                                       "pipeline.toml": GAMMA})  # fmt: skip
    for folder in ("a", "b", "g"):
        monkeypatch_module.syspath_prepend(str(work / folder))
    played = scenario("labeller")
    played["agents"]["summarize"] = {
        "steps": played["agents"]["summarize"],
        "variants": [{"when": "TRIAGER", "steps": [{"json": {"priority": 2}}]}],
    }
    played["agents"]["tag"] = [{"json": {"tags": ["checkout"]}}]
    played["faults"] = [{"agent": "summarize", "latency_ms": SUMMARIZE_LATENCY_MS}]
    with FakeGemini.start(played) as fake:
        settings = Settings(redis_url=url, gemini_base_url=fake.url,
                            google_api_key=SecretStr(CANARY_KEY))  # fmt: skip
        store = RunStore(client)
        found = Fleet(settings, store, fake, work / "a/labeller/pipeline.toml",
                      work / "b/triager/pipeline.toml", work / "g/gamma_only/pipeline.toml",
                      make_sample_repo(work / "repo.git"), work, "", "")  # fmt: skip
        found.stuck, found.corrupt = broken_runs(found, client)
        labeller, triager = load_pipeline(str(found.labeller)), load_pipeline(str(found.triager))
        env = worker_env(settings)
        with (  # each worker imports its own pipeline's schemas only
            services.worker({**env, "PYTHONPATH": str(work / "a")},
                            [s.queue for s in labeller.stages], logfile=work / "labeller.log",
                            name="labeller"),
            services.worker({**env, "PYTHONPATH": str(work / "b")},
                            [s.queue for s in triager.stages], logfile=work / "triager.log",
                            name="triager"),
        ):  # fmt: skip
            yield found
    client.close()


def broken_runs(fleet: Fleet, client: redis.Redis) -> tuple[str, str]:
    """Before any worker starts: a run whose record is corrupt, and a run stuck since long ago
    (its message lost), which the first worker's first sweep must still send again."""
    corrupt = fleet.enqueue(fleet.labeller, "A run whose record breaks")
    client.hset(keys.run(corrupt), "meta", "{not json")
    stuck = fleet.enqueue(fleet.labeller, "A run whose message was lost")
    client.delete("baton.labeller.summarize")

    def long_ago(run: RunRecord, _pipe: object) -> None:
        run.stages["summarize"].queued_at = time.time() - 3600

    fleet.store.transact(stuck, long_ago)
    return stuck, corrupt


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def sent(fleet: Fleet, agent: str, marker: str) -> list[str]:
    """The system instructions of the requests to `agent` that hold `marker`."""
    found = []
    for entry in fleet.fake.requests():
        instruction = json.dumps(entry["request"].get("systemInstruction", {}))
        if entry["agent"] == agent and marker in instruction:
            found.append(instruction)
    return found


def test_two_pipelines_with_a_stage_of_one_name_run_side_by_side_and_edits_wait(
    fleet: Fleet,
) -> None:
    mine = fleet.enqueue(fleet.labeller, "Checkout crashes on an empty cart (labeller)")
    theirs = fleet.enqueue(fleet.triager, "Checkout crashes on an empty cart (triager)")
    deadline = time.monotonic() + 30
    while fleet.store.get(mine).stages["summarize"].status != StageStatus.RUNNING:
        assert time.monotonic() < deadline, "the labeller's first stage did not start"
        time.sleep(0.05)
    spec = fleet.labeller.read_text()
    fleet.labeller.write_text(spec.replace(ORIGINAL, EDITED))  # mid-run

    done = {run_id: fleet.wait(run_id) for run_id in (mine, theirs)}

    assert {run.status for run in done.values()} == {RunStatus.DONE}
    assert (done[mine].pipeline, done[theirs].pipeline) == ("labeller", "triager")
    assert list(done[mine].stages) == ["summarize", "label"]
    assert list(done[theirs].stages) == ["summarize", "tag"]
    assert fleet.store.output(mine, "summarize") == {  # what the scaffold's scenario says
        "summary": "A report for the labeller pipeline.",
        "component": "core",
    }
    assert fleet.store.output(mine, "label") == {
        "labels": ["bug"],
        "reason": "It reports a failure.",
    }
    assert fleet.store.output(theirs, "summarize") == {"priority": 2}
    assert fleet.store.output(theirs, "tag") == {"tags": ["checkout"]}
    # Each pipeline's tasks went to its own workers, named by pipeline and stage.
    labeller_log = (fleet.logs / "labeller.log").read_text()
    triager_log = (fleet.logs / "triager.log").read_text()
    assert f"baton.labeller.summarize[{mine}.summarize]" in labeller_log
    assert f"baton.triager.summarize[{theirs}.summarize]" in triager_log
    assert "baton.triager." not in labeller_log and "baton.labeller." not in triager_log
    # The run kept the version it pinned: its label stage was told the original instruction.
    assert sent(fleet, "label", ORIGINAL) and not sent(fleet, "label", EDITED)
    assert load_pipeline(str(fleet.labeller)).digest != done[mine].pipeline_hash
    fleet.labeller.write_text(spec)


def test_the_reconciler_goes_on_past_a_corrupt_run(fleet: Fleet) -> None:
    """The first sweep (when the workers started) met the corrupt run first, and still sent
    the stuck one again."""
    assert fleet.wait(fleet.stuck).status == RunStatus.DONE
    assert fleet.store.get(fleet.stuck).stages["summarize"].attempts == 1
    logs = (fleet.logs / "labeller.log").read_text() + (fleet.logs / "triager.log").read_text()
    assert f"run {fleet.corrupt}: its record cannot be read" in logs
    assert f"run {fleet.stuck}: stage summarize was stuck queued; sent again" in logs


def test_a_stage_a_worker_cannot_load_fails_its_run_with_the_reason(fleet: Fleet) -> None:
    """gamma's only stage is routed to the labeller's worker, which cannot import its schemas:
    the run fails at once, saying so, instead of waiting on its queue."""
    run_id = fleet.enqueue(fleet.gamma, "Nobody here can run this")

    run = fleet.wait(run_id, timeout_s=30)

    assert run.status == RunStatus.FAILED
    assert run.stages["only"].status == StageStatus.FAILED
    assert run.reason is not None and run.reason.startswith("only: this worker cannot run it: ")
    assert "output schema 'gamma_only.schemas:Thing' cannot be imported" in run.reason
    assert "No module named 'gamma_only'" in run.reason

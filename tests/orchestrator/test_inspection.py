"""Reading a run back without Redis: audit entries made into a transcript, the time line of a
looped stage with a rate-limit wait, tokens summed over iterations, artifacts found by name,
credentials that name their scope, and a health check that says when Redis is away (the
sessions of `baton serve` are tested in test_server_sessions.py)."""

from __future__ import annotations

import json
import warnings

import pytest
import redis
from pydantic import SecretStr
from redis.backoff import NoBackoff
from redis.retry import Retry

from orchestrator.control import inspection
from orchestrator.control.flower import FlowerCredentials, flower_config
from orchestrator.control.server.app import create_app
from orchestrator.control.server.auth import Authenticator, Principal, ServeSettings
from orchestrator.core.conductor import Conductor
from orchestrator.core.errors import ArtifactNotFoundError, ConfigError
from orchestrator.core.models import (
    ArtifactRef,
    Issue,
    IssueSource,
    Iteration,
    RunRecord,
    RunStatus,
    StageRecord,
    StageStatus,
)
from orchestrator.core.queue import Dispatcher
from orchestrator.core.settings import QueueConfig
from orchestrator.core.store import RunStore

RUN = "20261201-120000-abcdef"


def ref(name: str) -> ArtifactRef:
    return ArtifactRef(run_id=RUN, name=name, size_bytes=1, sha256="0" * 64)


def run_with(**stages: StageRecord) -> RunRecord:
    return RunRecord(
        id=RUN, pipeline="fixer", repo="/r", commit="c" * 40, idempotency_key="k",
        issue=Issue(source=IssueSource.TEXT, title="t"), stages=stages, status=RunStatus.FAILED,
        created_at=100.0, updated_at=200.0,
    )  # fmt: skip


def stored(fields: dict[str, object]) -> dict[str, str]:
    """An entry as the stream gives it back: every value a string."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}


def test_a_model_turn_with_two_calls_and_its_usage_reads_as_parts() -> None:
    entry = inspection.read_entry(
        stored({
            "id": "5-1", "ts": "12.5", "branch": "fixer.search", "session": f"{RUN}:search:2",
            "kind": "tool_call", "author": "search",
            "data": {
                "content": {"parts": [
                    {"text": "thinking it over", "thought": True},
                    {"function_call": {"name": "read_file", "args": {"path": "a.py"}}},
                    {"function_call": {"name": "search_code", "args": {"pattern": "x"}}},
                ]},
                "usage": {"prompt_token_count": 900, "candidates_token_count": 30,
                          "thoughts_token_count": 12, "cached_content_token_count": 400},
            },
        })
    )  # fmt: skip
    assert (entry.stage, entry.attempt, entry.ts) == ("search", 2, 12.5)
    assert [(p.kind, p.tool) for p in entry.parts] == [
        ("thought", None), ("call", "read_file"), ("call", "search_code"),
    ]  # fmt: skip
    assert entry.parts[1].args == {"path": "a.py"}
    assert entry.usage == inspection.Usage(prompt_tokens=900, output_tokens=42, cached_tokens=400)


def test_a_transition_keeps_its_fields_and_a_run_level_entry_has_no_stage() -> None:
    waiting = inspection.read_entry(
        stored({"id": "1-0", "ts": "3", "branch": "fixer.fix", "session": f"{RUN}:fix:1",
                "kind": "stage_waiting", "data": {"delay_s": 30.0, "reason": "429"}})
    )  # fmt: skip
    assert (waiting.stage, waiting.data) == ("fix", {"delay_s": 30.0, "reason": "429"})
    cancelled = inspection.read_entry(
        stored({"id": "2-0", "ts": "4", "branch": "fixer.-", "session": f"{RUN}:-:0",
                "kind": "run_cancelled", "data": {"reason": "by ana"}})
    )  # fmt: skip
    assert (cancelled.stage, cancelled.attempt) == (None, None)
    garbage = inspection.read_entry({"id": "3-0", "ts": "5", "kind": "model_reply", "data": "{"})
    assert garbage.data == {"text": "{"}


def test_the_time_line_draws_each_iteration_and_a_rate_limit_wait() -> None:
    fix = StageRecord(
        status=StageStatus.FAILED, queued_at=110.0, started_at=150.0, finished_at=170.0,
        iteration=2, error="tests still fail",
        iterations=[
            Iteration(number=1, attempt=1, passed=False, reason="still failing",
                      started_at=120.0, finished_at=140.0),
            Iteration(number=2, attempt=2, passed=False, reason="still failing",
                      started_at=150.0, finished_at=170.0),
        ],
    )  # fmt: skip
    wait = inspection.Entry(
        id="1-0",
        ts=141.0,
        branch="fixer.fix",
        stage="fix",
        attempt=2,
        kind="stage_waiting",
        data={"delay_s": 5.0, "reason": "429"},
    )
    spans = inspection.timeline(run_with(fix=fix), [wait])
    assert [(s.label, s.state, s.start, s.end) for s in spans] == [
        ("fix", "queued", 110.0, 150.0),
        ("fix", "failed", 120.0, 140.0),
        ("fix", "waiting", 141.0, 146.0),
        ("fix.2", "failed", 150.0, 170.0),
    ]


def test_tokens_count_every_iteration_once() -> None:
    first = Iteration(number=1, attempt=1, passed=False, requests=3, prompt_tokens_total=1000,
                      started_at=1.0, finished_at=2.0)  # fmt: skip
    # The second iteration is under way: the record's own figures are its, so far.
    going = StageRecord(status=StageStatus.RUNNING, iteration=2, iterations=[first],
                        started_at=3.0, requests=1, prompt_tokens_total=300)  # fmt: skip
    # Queued again, not yet started: the record still holds the first iteration's figures.
    queued = StageRecord(status=StageStatus.QUEUED, iteration=2, iterations=[first],
                         started_at=1.0, requests=3, prompt_tokens_total=1000)  # fmt: skip
    tokens = inspection.tokens(run_with(fix=going, other=queued), [])
    assert [(s.stage, s.requests, s.prompt_tokens) for s in tokens.stages] == [
        ("fix", 4, 1300), ("other", 3, 1000),
    ]  # fmt: skip


def test_an_artifact_is_found_by_its_full_name_or_a_name_one_stage_has() -> None:
    run = run_with(
        fix=StageRecord(artifacts={"workspace.diff": ref("fix/workspace.diff"),
                                   "tests-after.log": ref("fix/tests-after.log")}),
        pr=StageRecord(artifacts={"workspace.diff": ref("pr/workspace.diff")}),
    )  # fmt: skip
    assert inspection.find_artifact(run, "tests-after.log").name == "fix/tests-after.log"
    assert inspection.find_artifact(run, "fix/workspace.diff").name == "fix/workspace.diff"
    with pytest.raises(ArtifactNotFoundError, match=r"2 stages have an artifact 'workspace\.diff'"):
        inspection.find_artifact(run, "workspace.diff")
    with pytest.raises(ArtifactNotFoundError, match=r"it has: fix/workspace\.diff, fix/tests-"):
        inspection.find_artifact(run, "build.log")
    assert inspection.change(run) == ref("pr/workspace.diff")  # the newest stage's


def test_credentials_must_name_a_scope_and_come_whole() -> None:
    with pytest.raises(ValueError, match="'ci': expected '<scope>:<secret>'"):
        ServeSettings(tokens={"ci": SecretStr("admin:abc")})
    with pytest.raises(ConfigError, match="both BATON_SERVE_USER and BATON_SERVE_PASSWORD"):
        Authenticator(ServeSettings(user="ana"))
    assert not Authenticator(ServeSettings()).configured
    token = Authenticator(ServeSettings(tokens={"ci": SecretStr("read:tok")}))
    assert token.bearer("tok") == Principal("ci", "read", "token")
    assert token.bearer("to") is None
    assert "zq9-secret" not in repr(ServeSettings(tokens={"ci": SecretStr("read:zq9-secret")}))


def test_the_health_check_says_503_when_redis_does_not_answer() -> None:
    dead = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    client = redis.Redis.from_url(dead, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    dispatcher = Dispatcher.connect(dead, QueueConfig())
    app = create_app(Conductor(RunStore(client), dispatcher), ServeSettings(), auth_required=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

        reply = TestClient(app).get("/api/v1/health")
    dispatcher.close()
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == "Redis does not answer: ConnectionError"


def test_the_example_files_placeholders_are_refused_as_secrets() -> None:
    examples = ServeSettings(
        user="ana", password=SecretStr("change-me-as-well"),
        secret=SecretStr("replace-with-openssl-rand-hex-32"),
        tokens={"ci": SecretStr("read:change-me"), "ok": SecretStr("read:9f8e7d")},
    )  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        examples.check_secrets()
    assert str(refused.value).startswith(
        "BATON_SERVE_PASSWORD, BATON_SERVE_SECRET, BATON_SERVE_TOKENS[ci] still hold the "
        "example's placeholder"
    )
    ServeSettings(user="ana", password=SecretStr("9f8e7d6c")).check_secrets()  # no error
    with pytest.raises(ConfigError, match="BATON_FLOWER_PASSWORD still hold"):
        flower_config(
            FlowerCredentials(user="ops", password=SecretStr("change-me-too")),
            port=5555, address="0.0.0.0", auth=True,
        )  # fmt: skip

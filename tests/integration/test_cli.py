"""The `baton` command as a user runs it: a subprocess with only environment variables."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from demo import SENTRY_EVENT
from demo.runner import make_sample_repo
from orchestrator.core import keys
from orchestrator.core.store import RunStore
from testkit.services import worker_env
from tests.containers import sandboxes

from .conftest import CANARY_KEY, Stack


def baton(
    *args: str, env: dict[str, str], stdin: bytes | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", *args],
        env={**os.environ, **env},
        input=stdin,
        capture_output=True,
        timeout=timeout_s,
    )


@pytest.fixture
def empty_db(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = redis_url.rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()
    client.close()


def sentry_without_exception() -> bytes:
    event = json.loads(SENTRY_EVENT.read_text())
    del event["exception"]
    return json.dumps(event).encode()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"event_id": "abc", "exception": {"values": [', b"malformed JSON at line 1, column"),
        (sentry_without_exception(), b"exception"),
        (
            json.dumps(
                {
                    "action": "opened",
                    "issue": {"number": 7, "body": "x"},
                    "repository": {"full_name": "o/r"},
                }
            ).encode(),
            b"issue.title",
        ),
        (b"x" * (20 * 1024 * 1024), b"over"),
    ],
    ids=["malformed-json", "sentry-without-exception", "github-without-title", "20MB"],
)
def test_bad_payloads_exit_non_zero_name_the_problem_and_write_nothing(
    payload: bytes, message: bytes, empty_db: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, client = empty_db
    repo = make_sample_repo(tmp_path / "repo")
    done = baton("enqueue", "-", "--repo", str(repo), env={"BATON_REDIS_URL": url}, stdin=payload)

    assert done.returncode == 2
    assert message in done.stderr
    assert done.stderr.startswith(b"error: ")
    assert b"Traceback" not in done.stderr
    assert done.stdout == b""
    assert client.dbsize() == 0


def test_a_repository_that_is_not_git_is_refused_before_anything_is_written(
    empty_db: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, client = empty_db
    done = baton(
        "enqueue", str(SENTRY_EVENT), "--repo", str(tmp_path), env={"BATON_REDIS_URL": url}
    )
    assert done.returncode == 2
    assert done.stderr.decode() == (
        f"error: {tmp_path}: not a git repository; give the repository's root, or make it a "
        "repository with `git init`\n"
    )
    assert client.dbsize() == 0


def test_enqueue_prints_the_run_id_and_watch_follows_it_to_the_end(
    stack: Stack, tmp_path: Path
) -> None:
    env = {"BATON_REDIS_URL": stack.settings.require_redis_url()}
    repo = stack.sample_repo()
    spec = tmp_path / "env.toml"  # in place of the spec detected: another test command, a variable
    spec.write_text('test = "python3 -B -m unittest discover -s tests -t . -v"\n'
                    '[env]\nCART_CURRENCY = "EUR"\n')  # fmt: skip
    enqueued = baton(
        "enqueue", str(SENTRY_EVENT), "--repo", str(repo), "--env", str(spec), "--force", env=env
    )
    run_id = enqueued.stdout.decode().strip()

    watched = baton("watch", run_id, "--interval", "0.2", env=env)
    shown = json.loads(baton("status", run_id, "--json", env=env).stdout)
    again = baton("enqueue", str(SENTRY_EVENT), "--repo", str(repo), "--env", str(spec), env=env)

    assert enqueued.returncode == 0 and len(run_id) == 22
    assert watched.returncode == 0
    assert f"run {run_id} · fixer · done".encode() in watched.stdout
    assert watched.stdout.endswith(b"\n")  # piped, the last frame still ends its line
    assert shown["status"] == "done"
    assert list(shown["stages"]) == ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]
    assert again.stdout.decode().strip() == run_id
    assert b"already has run" in again.stderr
    store = redis.Redis.from_url(env["BATON_REDIS_URL"], decode_responses=True)
    built = store.hgetall(f"baton:env:{shown['environment']}")
    assert built["test_command"] == "python3 -B -m unittest discover -s tests -t . -v"
    assert json.loads(built["spec"])["env"] == {"CART_CURRENCY": "EUR"}
    assert (built["passed"], built["failed"]) == ("2", "2")


def test_a_bad_environment_file_exits_2_naming_the_field_and_writes_nothing(
    empty_db: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, client = empty_db
    repo = make_sample_repo(tmp_path / "repo")
    spec = tmp_path / "env.toml"
    spec.write_text("[env]\nGITHUB_TOKEN = 'ghp_x'\n")
    done = baton(
        "enqueue", str(SENTRY_EVENT), "--repo", str(repo), "--env", str(spec),
        env={"BATON_REDIS_URL": url},
    )  # fmt: skip

    assert done.returncode == 2
    said = done.stderr.decode()
    assert said.startswith(f"error: {spec}: env: GITHUB_TOKEN looks like")
    assert b"ghp_x" not in done.stderr
    assert client.dbsize() == 0


def test_a_worker_serves_only_the_stages_it_is_given(
    redis_url: str, stack: Stack, tmp_path: Path
) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/4"
    env = {
        "BATON_REDIS_URL": url,
        "BATON_GEMINI_BASE_URL": stack.fake.url,
        "GOOGLE_API_KEY": CANARY_KEY,
        "BATON_REPO_CACHE_DIR": str(tmp_path / "cache"),
        "BATON_KEEP_MODEL_REQUESTS": "true",
    }
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.control.cli",
            "worker",
            "--stages",
            "triage,plan",
            "-c",
            "1",
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        repo = make_sample_repo(tmp_path / "repo")
        run_id = (
            baton("enqueue", str(SENTRY_EVENT), "--repo", str(repo), env=env)
            .stdout.decode()
            .strip()
        )
        deadline, shown = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            shown = json.loads(baton("status", run_id, "--json", env=env).stdout)
            if shown["stages"]["triage"]["status"] == "done":
                break
            time.sleep(0.3)
        time.sleep(2)
        shown = json.loads(baton("status", run_id, "--json", env=env).stdout)
        queued = redis.Redis.from_url(url).llen("baton.fixer.search")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()

    assert shown["stages"]["triage"]["status"] == "done"
    assert shown["stages"]["search"]["status"] == "queued"
    assert queued == 1
    store = RunStore.from_url(url)  # the triage's requests, as BATON_KEEP_MODEL_REQUESTS asked
    ref = store.get(run_id).stages["triage"].artifacts["model-requests.jsonl"]
    kept = [json.loads(line) for line in store.artifact(ref).decode().splitlines()]
    store.redis.close()
    assert [(r["agent"], r["number"]) for r in kept] == [("triage", 1)]
    assert "ZeroDivisionError" in json.dumps(kept[0]["config"])  # the issue, as sent
    assert CANARY_KEY not in json.dumps(kept)  # the key travels in a header, never kept
    assert b"baton.fixer.triage" in (tmp_path / "worker.log").read_bytes()


def test_demo_json_reports_every_stage_the_proof_and_the_branch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BATON_REDIS_URL"}
    # A Gemini key left in the environment: the demo still plays its scenario on the fake server.
    env |= {"HOME": str(tmp_path), "GOOGLE_API_KEY": "a-real-key-the-demo-must-not-use"}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "demo", "--json"],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    progress = done.stderr.decode()
    assert re.search(r"model: the fake Gemini server at http://127\.0\.0\.1:\d+,", progress)
    summary = json.loads(done.stdout)
    assert set(summary) >= {"run_id", "status", "stages"}
    assert summary["status"] == "done"
    stages = summary["stages"]
    assert list(stages) == ["triage", "search", "plan", "reproduce", "fix", "review", "pr"]
    common = {"status", "attempts", "requests", "prompt_tokens_total", "prompt_tokens_max",
              "output_chars", "duration_s"}  # fmt: skip
    extra = {"fix": {"tests_before", "tests_after", "proof"}, "pr": {"branch"}}
    for name, figures in stages.items():
        assert set(figures) == common | extra.get(name, set())
        assert figures["status"] == "done" and figures["attempts"] == 1
        assert figures["requests"] >= 1
        assert figures["prompt_tokens_total"] >= figures["prompt_tokens_max"] > 0
    # the sample's two failing empty-cart tests and the one the reproduce stage wrote
    assert stages["fix"]["tests_before"] == {"exit_code": 1, "passed": 2, "failed": 3}
    assert stages["fix"]["tests_after"] == {"exit_code": 0, "passed": 5, "failed": 0}
    proof = stages["fix"]["proof"]
    assert (proof["passed"], proof["pass_to_fail"]) == (True, [])
    assert proof["fail_to_pass"] == [
        "tests.test_empty_cart_checkout.EmptyCartCheckoutTest.test_checkout_summary_of_an_empty_cart"
    ]
    assert proof["reason"].startswith("proven: 1 reproducing tests fail without the change")
    assert stages["pr"]["branch"] == f"baton/{summary['run_id']}"
    assert sandboxes(summary["run_id"]) == []


def test_demo_review_json_posts_one_review_and_says_where_it_went(tmp_path: Path) -> None:
    """`make demo-review`'s command, as a newcomer runs it: the reviewer on the bundled pull
    request, against a private Redis, the fake Gemini and the fake GitHub."""
    env = {k: v for k, v in os.environ.items() if k != "BATON_REDIS_URL"} | {"HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "demo-review", "--json"],
        env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = json.loads(done.stdout)
    assert summary["status"] == "done"
    assert list(summary["stages"]) == ["summarise", "inspect", "test", "review"]
    [review] = summary["reviews"]
    assert summary["published"]["stage"] == "review"
    assert summary["published"]["url"].endswith(f"#pullrequestreview-{review['id']}")
    assert sandboxes(summary["run_id"]) == []


def test_top_shows_the_queues_the_workers_and_the_runs(stack: Stack) -> None:
    env = {"BATON_REDIS_URL": stack.settings.require_redis_url()}
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))

    fleet = json.loads(baton("top", "--json", env=env).stdout)

    assert run.status.value == "done"
    assert len(fleet["workers"]) >= 1
    assert all(name.startswith("celery@") or "@" in name for name in fleet["workers"])
    assert fleet["runs"].get("done", 0) >= 1
    assert set(fleet["queues"]) <= {
        f"baton.fixer.{s}" for s in ("triage", "search", "plan", "reproduce", "fix", "review", "pr")
    }


def test_watch_shows_what_a_running_stage_is_doing(stack: Stack) -> None:
    stack.fake.set_faults([{"agent": "search", "requests": [3], "latency_ms": 4_000}])
    # Live redraws only on an interactive console; these make rich treat the pipe as one.
    env = {"BATON_REDIS_URL": stack.settings.require_redis_url(), "COLUMNS": "160",
           "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}  # fmt: skip
    run_id = stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo())

    watched = baton("watch", run_id, "--interval", "0.2", env=env)

    # While its third model call is held 4 s, search has made two calls and used two tools.
    assert watched.returncode == 0
    assert re.search(rb"search\s.*running.*\s2\s.*thinking", watched.stdout) is not None


def test_replay_plays_a_stage_again_offline_from_its_record_and_writes_nothing(
    stack: Stack,
) -> None:
    run = stack.wait(stack.enqueue(SENTRY_EVENT.read_bytes(), stack.sample_repo()))
    assert run.status.value == "done", run.reason
    env = worker_env(stack.settings)
    store = redis.Redis.from_url(env["BATON_REDIS_URL"], decode_responses=True)
    audit_before, served_before = store.xlen(keys.audit(run.id)), len(stack.requests())

    done = baton("replay", run.id, "--stage", "fix", "--json", env=env, timeout_s=300)
    table = baton("replay", run.id, "--stage", "search", env=env, timeout_s=300)

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    replies = [turn["reply"] for turn in shown["turns"]]
    assert replies[:5] == [
        "call run_tests", "call edit_file", "call run_tests", "call run_tests", "call show_diff"
    ]  # fmt: skip
    assert replies[5].startswith('text: {"summary":"average_price_cents now returns 0')
    assert (shown["requests"], shown["same_output"], shown["error"]) == (6, True, None)
    assert shown["output"]["tests_after"]["failed"] == 0  # the tests ran again, in a sandbox
    assert shown["output"]["proof"]["passed"] is True  # and Baton proved the change again
    assert table.returncode == 0, table.stderr
    assert b"the replay gave the recorded output" in table.stdout
    assert store.xlen(keys.audit(run.id)) == audit_before  # nothing written into the run
    assert len(stack.requests()) == served_before  # no model was asked: the record answered

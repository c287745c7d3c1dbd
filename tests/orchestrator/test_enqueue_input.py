"""`baton enqueue FILE` reads a JSON payload file; plain text comes only on stdin or in --text,
so a file named by mistake (`baton enqueue README.md`) is refused and starts no run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from demo import SENTRY_EVENT
from orchestrator.control import api
from orchestrator.control.intake import parse_payload
from orchestrator.core.errors import IntakeError, NotJsonError
from orchestrator.core.models import IssueSource
from orchestrator.core.settings import Settings
from tests.repos import Upstream

ROOT = Path(__file__).resolve().parents[2]


def test_json_only_refuses_plain_text_saying_how_it_begins() -> None:
    with pytest.raises(NotJsonError) as caught:
        parse_payload(b"# Baton\n\nLLM agent pipelines", json_only=True)

    assert str(caught.value).startswith("not a JSON payload (it begins '# Baton LLM agent pipel")
    assert "a Sentry event" in str(caught.value)


def test_json_only_refuses_text_even_when_the_source_says_text() -> None:
    with pytest.raises(NotJsonError, match="it is blank"):
        parse_payload("  \n", IssueSource.TEXT, json_only=True)


def test_json_only_reads_a_json_payload_as_ever() -> None:
    data = SENTRY_EVENT.read_bytes()

    assert parse_payload(data, json_only=True) == parse_payload(data)


def test_read_issue_reads_a_payload_file_as_json_and_names_it_when_it_is_not(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "README.md"
    notes.write_text("Checkout crashes on an empty cart\n")

    with pytest.raises(NotJsonError) as caught:
        api.read_issue(notes)
    with pytest.raises(IntakeError, match=f"^{tmp_path}/missing.json: cannot be read"):
        api.read_issue(tmp_path / "missing.json")

    assert str(caught.value).startswith(f"{notes}: not a JSON payload (it begins 'Checkout")
    assert api.read_issue(SENTRY_EVENT).source == IssueSource.SENTRY_EVENT


def test_read_issue_takes_text_given_as_a_string_and_a_dict_as_json() -> None:
    assert api.read_issue("Checkout crashes\nbody").title == "Checkout crashes"
    event = json.loads(SENTRY_EVENT.read_text())
    assert api.read_issue(event) == api.read_issue(SENTRY_EVENT)


@pytest.fixture
def repo(make_upstream: Callable[[], Upstream]) -> Path:
    made = make_upstream()
    made.commit({"cart.py": "def total(prices):\n    return sum(prices)\n"})
    return made.work


def _enqueue(
    *args: str, url: str, cwd: Path, stdin: bytes = b""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "enqueue", *args],
        cwd=cwd,
        env={**os.environ, "BATON_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_baton_enqueue_of_a_file_that_is_not_json_exits_2_and_starts_no_run(
    repo: Path, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    (repo / "README.md").write_text("# Shop\n\nA shopping cart.\n")

    done = _enqueue("README.md", "--repo", ".", url=unit_redis_url, cwd=repo)

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: README.md: not a JSON payload (it begins '# Shop A")
    assert done.stderr.rstrip().endswith(
        'a report in plain text goes on stdin (`baton enqueue - ...`) or in --text "..."'
    )
    assert "Error" not in done.stderr.split(":")[1]
    assert done.stdout == ""
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "give a PAYLOAD file (or - for stdin), or --text"),
        (("x.json", "--text", "t"), "give a PAYLOAD file (or - for stdin) or --text, not both"),
        (("README.md", "--source", "text"), "a PAYLOAD file is read as JSON; give plain text"),
    ],
    ids=["nothing", "both", "a file as text"],
)
def test_baton_enqueue_refuses_a_report_given_two_ways_or_none(
    args: tuple[str, ...], said: str, repo: Path, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    done = _enqueue(*args, "--repo", ".", url=unit_redis_url, cwd=repo)

    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize(
    "args",
    [("--text", '{"not": "json to read"}\nbody'), ("-",)],
    ids=["--text", "stdin"],
)
def test_plain_text_from_stdin_or_text_makes_a_run(
    args: tuple[str, ...], repo: Path, unit_redis_url: str, redis_client: redis.Redis
) -> None:
    stdin = b"Checkout crashes on an empty cart\nbody" if args == ("-",) else b""
    done = _enqueue(*args, "--repo", ".", url=unit_redis_url, cwd=repo, stdin=stdin)

    assert done.returncode == 0, done.stderr
    run = api.get_run(done.stdout.strip(), settings=Settings(redis_url=unit_redis_url))
    expected = '{"not": "json to read"}' if args[0] == "--text" else "Checkout crashes on an "
    assert run.issue.source == IssueSource.TEXT and run.issue.title.startswith(expected)

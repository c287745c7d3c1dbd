"""What the `baton` command says when it fails: a sentence naming what was wrong, never a
Python class name or a traceback."""

from __future__ import annotations

import socket

import pytest
import redis.exceptions
from click.testing import CliRunner
from pydantic import ValidationError

from orchestrator.control.cli import main
from orchestrator.control.messages import complaint
from orchestrator.core.errors import RepoError, RunNotFoundError
from orchestrator.core.settings import Settings


def test_a_baton_error_is_its_message_alone() -> None:
    said = complaint(RepoError("/tmp/x: not a git repository"))
    missing = complaint(RunNotFoundError("abc"))

    assert said is not None and missing is not None
    assert (said.message, said.exit_code) == ("/tmp/x: not a git repository", 2)
    assert "RunNotFoundError" not in missing.message and "abc" in missing.message


def test_a_setting_that_does_not_validate_names_its_variable_not_the_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_QUEUE__RUN_TTL_S", "a week")
    with pytest.raises(ValidationError) as caught:
        Settings()

    said = complaint(caught.value)

    assert said is not None and said.exit_code == 2
    assert said.message == (
        "a setting is not valid: queue.run_ttl_s (BATON_QUEUE__RUN_TTL_S): Input should be a "
        "valid integer, unable to parse string as an integer"
    )


def test_a_redis_that_does_not_answer_is_said_plainly_with_exit_3() -> None:
    said = complaint(redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1."))

    assert said is not None and said.exit_code == 3
    assert said.message.startswith(
        "Redis does not answer at BATON_REDIS_URL (Error 111 connecting to 127.0.0.1:1.)"
    )


def test_a_bug_is_left_to_its_traceback() -> None:
    assert complaint(KeyError("x")) is None
    assert complaint(redis.exceptions.ResponseError("WRONGTYPE")) is None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_baton_status_with_a_bad_setting_fails_in_one_plain_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(A Redis that does not answer is said as `complaint` says it, after the connection's
    retries: the test above, without their wait.)"""
    monkeypatch.setenv("BATON_REDIS_URL", f"redis://127.0.0.1:{_closed_port()}/0")
    monkeypatch.setenv("BATON_QUEUE__RUN_TTL_S", "x")

    result = CliRunner().invoke(main, ["status", "some-run"])

    assert (result.exit_code, result.output) == (
        2,
        "error: a setting is not valid: queue.run_ttl_s (BATON_QUEUE__RUN_TTL_S): Input should "
        "be a valid integer, unable to parse string as an integer\n",
    )

"""`baton worker` checks what it needs before it starts Celery (no services involved)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.control.cli import main


def test_a_worker_without_a_model_key_refuses_to_start_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("BATON_GEMINI_BASE_URL", "http://127.0.0.1:8765")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("BATON_GOOGLE_API_KEY", raising=False)

    result = CliRunner().invoke(main, ["worker", "--stages", "triage"])

    assert result.exit_code == 2
    assert "no Gemini API key: set GOOGLE_API_KEY" in result.output
    assert "BATON_GEMINI_BASE_URL is http://127.0.0.1:8765" in result.output


def test_the_commands_of_other_packages_are_listed() -> None:
    result = CliRunner().invoke(main, ["--help"])

    assert result.exit_code == 0
    for command in ("worker", "demo", "fake-gemini", "enqueue", "cancel"):
        assert f"  {command} " in result.output


def test_a_worker_with_more_processes_than_messages_it_may_hold_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("GOOGLE_API_KEY", "any-key")
    monkeypatch.setenv("BATON_QUEUE__ETA_TASK_LIMIT", "2")

    result = CliRunner().invoke(main, ["worker", "--stages", "triage", "--concurrency", "3"])

    assert result.exit_code == 2
    assert "--concurrency 3 is above BATON_QUEUE__ETA_TASK_LIMIT (2)" in result.output


LITELLM_ONLY = """
name = "elsewhere"
model = "openai/gpt-4.1-mini"

[[stages]]
name = "summarize"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Summarize: {issue}"
"""


def test_a_worker_checks_the_keys_of_the_models_its_stages_run_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pipeline = tmp_path / "elsewhere.toml"
    pipeline.write_text(LITELLM_ONLY)
    monkeypatch.setenv("BATON_REDIS_URL", "redis://127.0.0.1:1/0")
    for variable in ("GOOGLE_API_KEY", "BATON_GOOGLE_API_KEY", "OPENAI_API_KEY",
                     "BATON_OPENAI_API_KEY"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("BATON_QUEUE__ETA_TASK_LIMIT", "2")
    argv = ["worker", "--pipeline", str(pipeline), "--concurrency", "3"]

    without = CliRunner().invoke(main, argv)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-any")
    with_key = CliRunner().invoke(main, argv)

    assert without.exit_code == 2
    assert "no API key for openai/gpt-4.1-mini: set OPENAI_API_KEY" in without.output
    # No Gemini key needed: the next check is the one that stops it.
    assert with_key.exit_code == 2
    assert "--concurrency 3 is above BATON_QUEUE__ETA_TASK_LIMIT (2)" in with_key.output

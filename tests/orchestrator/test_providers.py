"""A model per stage: which ids name which provider, how a spec and `BATON_MODEL` name them, and
where each provider's key and base URL come from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.core.errors import PipelineError
from orchestrator.core.pipeline import load_pipeline
from orchestrator.core.providers import GEMINI, litellm_missing, parse_model
from orchestrator.core.settings import Settings
from workers.settings import WorkerSettings

STAGES = """
[[stages]]
name = "triage"
{triage_model}output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Summarize: {{issue}}"

[[stages]]
name = "fix"
output_schema = "orchestrator.pipelines.schemas:Summary"
instruction = "Shorten: {{triage}}"
"""


def spec(tmp_path: Path, *, pipeline_model: str = "", triage_model: str = "") -> Path:
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.toml"
    head = f'name = "mine"\n{pipeline_model and f"model = {pipeline_model!r}"}\n'
    body = STAGES.format(triage_model=triage_model and f"model = {triage_model!r}\n")
    path.write_text(head + body)
    return path


@pytest.mark.parametrize(
    ("model_id", "provider", "name"),
    [
        ("gemini-3.8-flash", GEMINI, "gemini-3.8-flash"),
        ("gemma-3-27b-it", GEMINI, "gemma-3-27b-it"),
        ("openai/gpt-4.1-mini", "openai", "gpt-4.1-mini"),
        ("anthropic/claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5"),
        ("ollama_chat/qwen3:8b", "ollama_chat", "qwen3:8b"),
        ("hosted_vllm/meta-llama/Llama-3.1-8B-Instruct", "hosted_vllm",
         "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)  # fmt: skip
def test_a_model_id_names_its_provider(model_id: str, provider: str, name: str) -> None:
    ref = parse_model(model_id)
    assert (ref.id, ref.provider, ref.name) == (model_id, provider, name)
    assert ref.via_litellm is (provider != GEMINI)


@pytest.mark.parametrize(
    ("model_id", "said"),
    [
        ("foo/bar", "unknown provider 'foo'"),
        ("gemini/gemini-3.8-flash", "Gemini is reached as gemini-…"),
        ("azure/gpt-4o", "unknown provider 'azure'"),
        ("gpt-4o", "names no provider"),
        ("openai/", "no model name"),
        ("openai/gpt 4", "no model name"),
        ("", "names no provider"),
    ],
)
def test_an_unknown_or_malformed_model_is_refused(model_id: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_model(model_id)


def test_the_refusal_lists_the_providers_there_are() -> None:
    with pytest.raises(ValueError) as refused:
        parse_model("groq/llama3")
    assert str(refused.value) == (
        "model 'groq/llama3' names an unknown provider 'groq'; known: gemini-…, openai/…, "
        "anthropic/…, ollama_chat/…, hosted_vllm/…"
    )


def test_a_stage_runs_on_its_model_else_the_pipelines_else_baton_model(tmp_path: Path) -> None:
    both = load_pipeline(str(spec(tmp_path, pipeline_model="anthropic/claude-x",
                                  triage_model="openai/gpt-4.1-mini")))  # fmt: skip
    neither = load_pipeline(str(spec(tmp_path)))

    assert [both.model_of(s, "gemini-3.8-flash") for s in both.stages] == [
        "openai/gpt-4.1-mini", "anthropic/claude-x",
    ]  # fmt: skip
    assert [neither.model_of(s, "gemini-3.8-flash") for s in neither.stages] == [
        "gemini-3.8-flash", "gemini-3.8-flash",
    ]  # fmt: skip


def test_an_unknown_provider_in_a_spec_names_the_file_the_stage_and_the_field(
    tmp_path: Path,
) -> None:
    path = spec(tmp_path, triage_model="openia/gpt-4.1-mini")
    with pytest.raises(PipelineError) as refused:
        load_pipeline(str(path))

    said = str(refused.value)
    assert said.startswith(f"{path} is invalid")
    assert "stages.0.model" in said
    assert "stage 'triage': model 'openia/gpt-4.1-mini' names an unknown provider 'openia'" in said


def test_an_unknown_pipeline_model_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"(?s)invalid.*\nmodel\n.*unknown provider 'vertex'"):
        load_pipeline(str(spec(tmp_path, pipeline_model="vertex/gemini-pro")))


def test_baton_model_may_name_any_known_provider_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATON_MODEL", "openai/gpt-4.1-mini")
    assert Settings().model == "openai/gpt-4.1-mini"
    monkeypatch.setenv("BATON_MODEL", "mistral/large")
    with pytest.raises(ValidationError, match="unknown provider 'mistral'"):
        Settings()


def test_each_provider_has_its_key_and_base_url_and_keys_may_come_from_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "anthropic-key"
    key_file.write_text("sk-ant-from-a-file\n")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("BATON_OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY_FILE", str(key_file))
    monkeypatch.setenv("BATON_VLLM_BASE_URL", "http://vllm:8000/v1")
    monkeypatch.setenv("BATON_MODEL_TIMEOUT_S", "30")
    settings = WorkerSettings()

    openai, anthropic = settings.provider_section("openai"), settings.provider_section("anthropic")
    vllm, ollama = (
        settings.provider_section("hosted_vllm"),
        settings.provider_section("ollama_chat"),
    )
    assert openai.api_key is not None and openai.api_key.get_secret_value() == "sk-openai"
    assert (openai.base_url, openai.timeout_s, openai.key_variable) == (
        "http://127.0.0.1:8000/v1", 30.0, "OPENAI_API_KEY",
    )  # fmt: skip
    assert anthropic.api_key is not None
    assert anthropic.api_key.get_secret_value() == "sk-ant-from-a-file"
    assert (anthropic.base_url, vllm.base_url, vllm.api_key) == (None, "http://vllm:8000/v1", None)
    assert (ollama.api_key, ollama.key_variable) == (None, None)
    assert "sk-openai" not in repr(settings) and "sk-ant-from-a-file" not in repr(settings)


def test_a_litellm_model_without_litellm_installed_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)  # what an install without the extra has

    said = litellm_missing(parse_model("anthropic/claude-sonnet-4-5"))

    assert said is not None
    assert "anthropic/claude-sonnet-4-5" in said and "pip install 'baton[litellm]'" in said
    assert litellm_missing(parse_model("gemini-3.8-flash")) is None  # Gemini needs no LiteLLM


def test_control_a_litellm_model_with_litellm_installed_misses_nothing() -> None:
    assert litellm_missing(parse_model("anthropic/claude-sonnet-4-5")) is None

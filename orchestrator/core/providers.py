"""Which model a stage names, and which provider serves it.

A model id is one of:

* a Gemini model name, `gemini-…` (or `gemma-…`, which the Gemini API serves too): reached
  through google-genai, Baton's default;
* `<provider>/<model>`, LiteLLM's form, for a provider in `LITELLM_PROVIDERS`: reached through
  ADK's `LiteLlm` wrapper (`workers.lite_llm`), e.g. `openai/gpt-4.1-mini`,
  `anthropic/claude-sonnet-4-5`, `ollama_chat/qwen3:8b`, `hosted_vllm/meta-llama/Llama-3.1-8B`.

Anything else is refused where it is read (a pipeline spec, `BATON_MODEL`), naming the
providers Baton knows: each one has its own key and base-URL settings
(`orchestrator.core.settings.Settings.provider_section`) and its own rate-limit signals
(`workers.ratelimits`), so a provider is added here, there and there together.

The model id is also what the fleet's quota governor keys a model by
(`orchestrator.core.keys.quota`): a LiteLLM id carries its provider, and a Gemini name never
holds a `/`, so two providers' quotas and cooldowns never share a key.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

GEMINI = "gemini"
"""The provider of bare `gemini-…` names: Google's Gemini API through google-genai."""

LITELLM_PROVIDERS: dict[str, str] = {
    "openai": "OpenAI, or any OpenAI-compatible server (BATON_OPENAI_BASE_URL)",
    "anthropic": "Anthropic's Messages API",
    "ollama_chat": "an Ollama server's chat API (BATON_OLLAMA_BASE_URL)",
    "hosted_vllm": "a vLLM server's OpenAI-compatible API (BATON_VLLM_BASE_URL)",
}
"""The LiteLLM providers a stage may name, by the prefix of their model ids."""

_GEMINI_NAME = re.compile(r"^(?:gemini|gemma)-[A-Za-z0-9][\w.:-]*$")
_LITELLM_NAME = re.compile(r"^[\w.:@-]+(?:/[\w.:@-]+)*$")


@dataclass(frozen=True)
class ModelRef:
    """A checked model id: the provider that serves it and the model's name there."""

    id: str
    """As named: `gemini-3.8-flash`, `openai/gpt-4.1-mini`."""
    provider: str
    """`GEMINI` or a key of `LITELLM_PROVIDERS`."""
    name: str
    """The model's name at its provider (the id without the provider's prefix)."""

    @property
    def via_litellm(self) -> bool:
        """Whether the model is reached through LiteLLM rather than google-genai."""
        return self.provider != GEMINI


def parse_model(model_id: str) -> ModelRef:
    """The provider and name of `model_id`.

    Raises:
        ValueError: the id names no provider Baton knows, or is malformed; the message says
            which providers there are.
    """
    text = model_id.strip()
    if "/" not in text:
        if _GEMINI_NAME.match(text):
            return ModelRef(text, GEMINI, text)
        raise ValueError(
            f"model {model_id!r} names no provider: write a Gemini model (gemini-…) or "
            f"<provider>/<model> with a provider of {_known()}"
        )
    provider, _, name = text.partition("/")
    if provider not in LITELLM_PROVIDERS:
        hint = " (Gemini is reached as gemini-…, through google-genai)" if provider in (
            "gemini", "vertex_ai", "google") else ""  # fmt: skip
        raise ValueError(
            f"model {model_id!r} names an unknown provider {provider!r}{hint}; known: {_known()}"
        )
    if not _LITELLM_NAME.match(name):
        raise ValueError(f"model {model_id!r} has no model name after {provider + '/'!r}")
    return ModelRef(text, provider, name)


def _known() -> str:
    return ", ".join(["gemini-…", *(f"{p}/…" for p in LITELLM_PROVIDERS)])


LITELLM_EXTRA = "pip install 'baton[litellm]'"
"""What installs LiteLLM beside Baton: it is an extra (pyproject.toml says why)."""


def litellm_missing(ref: ModelRef) -> str | None:
    """Why `ref` cannot run here when it needs LiteLLM and LiteLLM is not installed, with the
    command that installs it; None when nothing is missing."""
    if not ref.via_litellm or _importable("litellm"):
        return None
    return f"{ref.id} runs through LiteLLM, which is not installed here: {LITELLM_EXTRA}"


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None

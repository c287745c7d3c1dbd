"""Configuration: one `Settings` object, read from the environment once per entry point.

Library code never reads `os.environ`; it takes the section it needs as an argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from orchestrator.core.connection import RedisConfig, checked_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.prices import ModelPrice
from orchestrator.core.providers import parse_model
from orchestrator.core.secret_settings import FromFile, SecretFilesSource
from orchestrator.core.secret_settings import refuse_placeholders as refuse_placeholders

FAKE_API_KEY = "fake-gemini-key"
"""The key Baton hands the real client when it talks to the bundled fake server."""
GEMINI_API_URL = "https://generativelanguage.googleapis.com"
"""Where google-genai sends requests when no base URL is set: Google's Gemini API."""
DEFAULT_MODEL = "gemini-3.8-flash"
"""The model stages use unless `BATON_MODEL` names another: the newest generally available
Gemini 3 Flash model (Google's agentic workhorse), which requires thought signatures back on
function calls."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    """How stages reach Gemini."""

    name: str = DEFAULT_MODEL
    """Model name sent to the API."""
    base_url: str | None = None
    """Override of the API's base URL (the fake server's address in tests and the demo)."""
    api_key: SecretStr | None = None
    """The Gemini API key; never logged, never put in a prompt, a sandbox or an artifact."""
    timeout_s: float = 120.0
    """Per-request HTTP timeout."""
    streaming: bool = False
    """Use `streamGenerateContent` (SSE) instead of `generateContent`."""


class ProviderConfig(_Section):
    """How stages reach one LiteLLM provider (`orchestrator.core.providers.LITELLM_PROVIDERS`)."""

    provider: str
    """The provider's prefix in model ids: `openai`, `anthropic`, …"""
    base_url: str | None = None
    """Where its API is (LiteLLM's `api_base`); None: the provider's own."""
    api_key: SecretStr | None = None
    """Its API key; used on the worker host only, never logged, never put in a prompt, a
    sandbox or an artifact."""
    timeout_s: float = 120.0
    """Per-request HTTP timeout."""

    @property
    def key_variable(self) -> str | None:
        """The environment variable its key is read from (None: it takes no key)."""
        return PROVIDER_KEYS.get(self.provider)


PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "hosted_vllm": "HOSTED_VLLM_API_KEY",
}
"""The variable each provider's key is read from (each also as `BATON_<VARIABLE>` and, for a
file, `<VARIABLE>_FILE`); a provider not named takes none (a local Ollama)."""


class RetryConfig(_Section):
    """Bounds on retries of model calls."""

    rate_limit_max_retries: int = 8
    """How many times one stage may be put back on its queue after a 429."""
    rate_limit_max_wait_s: float = 900.0
    """Total time one stage may spend waiting on 429s before it fails."""
    rate_limit_jitter_s: float = 1.0
    """Upper bound of the random delay added to the server's `retryDelay` (never subtracted)."""
    rate_limit_fallback_s: float = 10.0
    """First backoff step when a 429 names no delay (doubled per retry, capped at 120 s)."""
    inline_wait_max_s: float = 10.0
    """A quota or cooldown wait up to this long is slept inside the stage; a longer one puts
    the stage back on its queue with that countdown, freeing the worker."""
    transient_attempts: int = 4
    """Attempts per model call on 5xx, timeouts and dropped connections."""
    transient_initial_s: float = 0.5
    """First backoff step for transient errors."""
    transient_max_s: float = 20.0
    """Largest single backoff step for transient errors."""


class QuotaConfig(_Section):
    """A model's quota, shared by every worker of the fleet (None: no limit of that kind)."""

    requests_per_minute: PositiveInt | None = None
    """Model calls per sliding minute."""
    tokens_per_minute: PositiveInt | None = None
    """Prompt plus reply tokens per sliding minute (estimated before a call, corrected after)."""


class QueueConfig(_Section):
    """Celery and Redis settings that keep stages from being lost or run twice."""

    visibility_timeout_s: int = 3600
    """Redis transport visibility timeout; every stage's hard time limit plus the largest
    countdown must stay below it, or a second worker would pick the same stage up."""
    run_ttl_s: int = 7 * 24 * 3600
    """How long a finished run's keys are kept."""
    lease_s: float = 30.0
    """A running stage renews its lease every third of this; a lease this old means its
    worker is gone, and the reconciler puts the stage back on its queue."""
    reconcile_every_s: float = 30.0
    """How often one worker of the fleet looks for stuck runs."""
    stuck_after_s: float = 120.0
    """A queued or waiting stage whose message is nowhere after this long is sent again."""
    max_interrupted: int = 3
    """Executions of one stage that may be lost before the run fails."""
    eta_task_limit: int = Field(4, ge=1)
    """Most messages one worker (all its processes together) may hold unacknowledged, the
    stages it runs and the retries waiting out their countdown (a 429's `retryDelay`) alike;
    keep it above the worker's `--concurrency`. Celery raises a worker's prefetch by one for
    each such retry and, unbounded, a worker would hoard messages no other worker or autoscaler
    sees (the queue's length no longer counts them)."""


class BatonSettings(BaseSettings):
    """What every settings class of Baton shares: each secret setting `X` may come from the
    file `X_FILE` names (`orchestrator.core.secret_settings`), and a value that fails validation is
    never echoed in the error (it may be a secret)."""

    model_config = SettingsConfigDict(hide_input_in_errors=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = SecretFilesSource(settings_cls)
        return init_settings, env_settings, files, dotenv_settings, file_secret_settings


class Settings(BatonSettings):
    """Everything Baton reads from the environment (prefix `BATON_`)."""

    model_config = SettingsConfigDict(
        env_prefix="BATON_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    redis_url: Annotated[str | None, FromFile()] = Field(None, repr=False)
    """`BATON_REDIS_URL` (or `BATON_REDIS_URL_FILE`); unset means the demo starts a private
    redis-server. Checked before use (`orchestrator.core.connection`): a password of at least 16
    characters, and a user and a password for any Redis not on this host."""
    redis_ca_file: Path | None = None
    """`BATON_REDIS_CA_FILE`: the CA bundle a `rediss://` Redis's certificate must chain to
    (the system's CAs are trusted too); the certificate and its host name are always checked."""
    google_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("GOOGLE_API_KEY", "BATON_GOOGLE_API_KEY")
    )
    """`GOOGLE_API_KEY`; any non-empty value for the fake Gemini server. The demo uses it only
    when told `--real-model`."""
    gemini_base_url: str | None = None
    """`BATON_GEMINI_BASE_URL`; where the google-genai client sends requests (unset: Google's
    `GEMINI_API_URL`)."""
    model: str = DEFAULT_MODEL
    """`BATON_MODEL`: the model of every stage whose pipeline names none, `gemini-…` or a
    LiteLLM id such as `openai/gpt-4.1-mini` (`orchestrator.core.providers`)."""
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "BATON_OPENAI_API_KEY")
    )
    """`OPENAI_API_KEY`: the key of `openai/…` models (any non-empty value for a local
    OpenAI-compatible server that checks none)."""
    openai_base_url: str | None = None
    """`BATON_OPENAI_BASE_URL`: an OpenAI-compatible API for `openai/…` models (with its `/v1`);
    unset, OpenAI's."""
    anthropic_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "BATON_ANTHROPIC_API_KEY")
    )
    """`ANTHROPIC_API_KEY`: the key of `anthropic/…` models."""
    anthropic_base_url: str | None = None
    """`BATON_ANTHROPIC_BASE_URL`; unset, Anthropic's API."""
    ollama_base_url: str | None = None
    """`BATON_OLLAMA_BASE_URL` for `ollama_chat/…` models; unset, LiteLLM's default
    (`http://localhost:11434`)."""
    vllm_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("HOSTED_VLLM_API_KEY", "BATON_VLLM_API_KEY")
    )
    """`HOSTED_VLLM_API_KEY`: the key a vLLM server was started with (`--api-key`), if any."""
    vllm_base_url: str | None = None
    """`BATON_VLLM_BASE_URL`: the vLLM server of `hosted_vllm/…` models (with its `/v1`)."""
    model_timeout_s: float = 120.0
    """`BATON_MODEL_TIMEOUT_S`."""
    streaming: bool = False
    """`BATON_STREAMING`: stream model replies over SSE."""
    sandbox_image: str | None = None
    """`BATON_SANDBOX_IMAGE`: the image code stages run in; unset, the one `make` builds."""
    repo_cache_dir: Path = Path.home() / ".cache" / "baton" / "repos"
    """`BATON_REPO_CACHE_DIR`: one mirror clone per repository, shared by all stages."""
    retry: RetryConfig = RetryConfig()
    queue: QueueConfig = QueueConfig()
    quotas: dict[str, QuotaConfig] = {}
    """`BATON_QUOTAS='{"gemini-3.8-flash": {"requests_per_minute": 60}}'`: per model."""
    default_quota: QuotaConfig = QuotaConfig()
    """The quota of a model `quotas` does not name (`BATON_DEFAULT_QUOTA__REQUESTS_PER_MINUTE`)."""
    prices: dict[str, ModelPrice] = {}
    """`BATON_PRICES='{"gemini-3.8-flash": {"input_usd_per_mtok": …, "output_usd_per_mtok":
    …}}'`: model prices in US dollars per million tokens, over `orchestrator.core.prices.PRICES`
    (a model in neither has no estimated cost)."""

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return parse_model(value).id

    def model_section(self) -> ModelConfig:
        return ModelConfig(
            name=self.model,
            base_url=self.gemini_base_url,
            api_key=self.google_api_key,
            timeout_s=self.model_timeout_s,
            streaming=self.streaming,
        )

    def provider_section(self, provider: str) -> ProviderConfig:
        """How stages reach the LiteLLM `provider`
        (`orchestrator.core.providers.LITELLM_PROVIDERS`)."""
        given: dict[str, tuple[str | None, SecretStr | None]] = {
            "openai": (self.openai_base_url, self.openai_api_key),
            "anthropic": (self.anthropic_base_url, self.anthropic_api_key),
            "ollama_chat": (self.ollama_base_url, None),
            "hosted_vllm": (self.vllm_base_url, self.vllm_api_key),
        }
        base_url, api_key = given.get(provider, (None, None))
        return ProviderConfig(
            provider=provider, base_url=base_url, api_key=api_key, timeout_s=self.model_timeout_s
        )

    def redis_section(self) -> RedisConfig:
        """How to reach Redis, checked.

        Raises:
            ConfigError: `BATON_REDIS_URL` is unset, or breaks a rule of
                `orchestrator.core.connection` (the message says which, never the password).
        """
        if not self.redis_url:
            raise ConfigError(
                "BATON_REDIS_URL is not set; point it at your Redis, e.g. redis://localhost:6379/0"
            )
        return checked_config(self.redis_url, self.redis_ca_file)

    def require_redis_url(self) -> str:
        """`BATON_REDIS_URL`, checked as `redis_section` does."""
        return self.redis_section().url

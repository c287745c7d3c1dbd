"""What a model call costs: a small price table per model, for a run's estimated cost.

Every figure is a list price in US dollars per million tokens (standard tier: no batch, cache or
priority rate), with the page it was read from and that page's date beside it (`Listed`). The
pages are the providers' own where their text could be read (Anthropic's), else a verbatim
transcription of the provider's page or articles that quote it; every figure is also checked
against LiteLLM's price list in the version `requirements.lock` pins
(`litellm/model_prices_and_context_window_backup.json` of litellm 1.91.5), where it has the
model (tests/orchestrator/test_prices.py compares them). A model whose price could not be cited
is not in the table.

What the estimate ignores: cached-prompt discounts (a cached prompt is counted at the full input
rate, so the estimate errs high), audio and image rates, batch and priority tiers, and a price
change the table does not list. What it models: a long-prompt tier (Gemini 2.5 Pro and 3.1 Pro,
Claude Sonnet 4 bill a whole call at higher rates once its prompt is over 200k tokens), and a
price announced to change on a date (`gemini-3.8-flash`'s, on 2027-01-01).

A deployment's own prices (a discount, a model the table lacks) go in `BATON_PRICES`, which wins
over the table: `BATON_PRICES='{"my-model": {"input_usd_per_mtok": …, "output_usd_per_mtok": …}}'`.
A model in neither has no estimated cost: its calls are counted as not costed and `status` says
so, and a run with a cost limit whose stages run on such a model is refused at enqueue
(`orchestrator.core.runbudget.check_priced`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

LONG_PROMPT_TOKENS = 200_000
"""The prompt size above which the providers' long-prompt tiers bill a whole call."""


class ModelPrice(BaseModel):
    """One model's price per million tokens; thoughts are billed as output. With the `long_*`
    rates, a call whose prompt is over `long_prompt_tokens` is billed at those, prompt and
    output alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    long_input_usd_per_mtok: float | None = Field(None, ge=0)
    long_output_usd_per_mtok: float | None = Field(None, ge=0)
    long_prompt_tokens: int = Field(LONG_PROMPT_TOKENS, gt=0)

    @model_validator(mode="after")
    def _both_long_rates(self) -> ModelPrice:
        if (self.long_input_usd_per_mtok is None) != (self.long_output_usd_per_mtok is None):
            raise ValueError(
                "long_input_usd_per_mtok and long_output_usd_per_mtok go together (a call over "
                "long_prompt_tokens is billed at both)"
            )
        return self

    def cost_usd(self, prompt_tokens: int, output_tokens: int) -> float:
        """The price of one call of `prompt_tokens` in and `output_tokens` out."""
        rate_in, rate_out = self.input_usd_per_mtok, self.output_usd_per_mtok
        if self.long_input_usd_per_mtok is not None and prompt_tokens > self.long_prompt_tokens:
            rate_in, rate_out = self.long_input_usd_per_mtok, self.long_output_usd_per_mtok or 0
        return (prompt_tokens * rate_in + output_tokens * rate_out) / 1_000_000


@dataclass(frozen=True)
class Listed:
    """A price as a page gave it: where, and the page's date (or the day it was read)."""

    price: ModelPrice
    source: str
    as_of: str
    since: date | None = None
    """The day this price starts (a change the page announced); None: in force already."""


def _price(
    input_usd: float, output_usd: float, long: tuple[float, float] | None = None
) -> ModelPrice:
    return ModelPrice(
        input_usd_per_mtok=input_usd,
        output_usd_per_mtok=output_usd,
        long_input_usd_per_mtok=long[0] if long else None,
        long_output_usd_per_mtok=long[1] if long else None,
    )


GEMINI_PAGE = (
    "https://ai.google.dev/gemini-api/docs/pricing, as transcribed verbatim on 2026-10-07 in "
    "https://github.com/api-evangelist/deepmind/blob/main/plans/deepmind-plans-pricing.yml"
)
GEMINI_25_ARTICLE = "https://deploybase.ai/articles/gemini-api-pricing-2026 (2026-01-08)"
OPENAI_ARTICLE = "https://deploybase.ai/articles/openai-pricing (OpenAI's page, March 2026)"
ANTHROPIC_PAGE = (
    "https://platform.claude.com/docs/zh-CN/about-claude/pricing (undated; read 2026-12-02)"
)
ANTHROPIC_LONG = "https://apidog.com/blog/claude-sonnet-4-6-pricing (long context over 200K)"

PRICES: dict[str, tuple[Listed, ...]] = {
    "gemini-3.8-flash": (
        Listed(_price(0.75, 3.75), GEMINI_PAGE, "2026-10-07"),
        Listed(_price(1.50, 7.50), GEMINI_PAGE, "2026-10-07", since=date(2027, 1, 1)),
    ),
    "gemini-3.5-flash": (Listed(_price(1.50, 9.00), GEMINI_PAGE, "2026-10-07"),),
    "gemini-3.5-flash-lite": (Listed(_price(0.30, 2.50), GEMINI_PAGE, "2026-10-07"),),
    "gemini-3.1-pro-preview": (
        Listed(_price(2.00, 12.00, long=(4.00, 18.00)), GEMINI_PAGE, "2026-10-07"),
    ),
    "gemini-2.5-pro": (
        Listed(
            _price(1.25, 10.00, long=(2.50, 15.00)),
            f"{GEMINI_PAGE} (input); {GEMINI_25_ARTICLE} (output)",
            "2026-10-07",
        ),
    ),
    "gemini-2.5-flash": (
        Listed(_price(0.30, 2.50), f"{GEMINI_PAGE} (input); {GEMINI_25_ARTICLE}", "2026-10-07"),
    ),
    "gemini-2.5-flash-lite": (
        Listed(
            _price(0.10, 0.40),
            f"{GEMINI_PAGE} (output); https://nicolalazzari.ai/articles/gemini-api-pricing-"
            "explained-2026 (input)",
            "2026-10-07",
        ),
    ),
    "openai/gpt-4.1": (Listed(_price(2.00, 8.00), OPENAI_ARTICLE, "2026-03"),),
    "openai/gpt-4.1-mini": (Listed(_price(0.40, 1.60), OPENAI_ARTICLE, "2026-03"),),
    "openai/gpt-4.1-nano": (Listed(_price(0.10, 0.40), OPENAI_ARTICLE, "2026-03"),),
    "anthropic/claude-sonnet-4-20250514": (
        Listed(
            _price(3.00, 15.00, long=(6.00, 22.50)),
            f"{ANTHROPIC_PAGE}; {ANTHROPIC_LONG}",
            "2026-12-02",
        ),
    ),
    "anthropic/claude-3-5-haiku-20241022": (
        Listed(_price(0.80, 4.00), ANTHROPIC_PAGE, "2026-12-02"),
    ),
}
"""Model id (as stages name it, `orchestrator.core.providers`) → its list prices, oldest
first. Not listed for want of a citable figure: the Gemini 2.0 models (retired) and every model
the pages above do not show."""


def price_of(
    model: str, overrides: Mapping[str, ModelPrice] | None = None, *, on: date | None = None
) -> ModelPrice | None:
    """The price of `model` on the day `on` (today, UTC): the deployment's (`BATON_PRICES`),
    else the table's price in force that day, else None (its cost is not estimated)."""
    if overrides and model in overrides:
        return overrides[model]
    day = on or datetime.now(UTC).date()
    in_force = [
        listed for listed in PRICES.get(model, ()) if not listed.since or listed.since <= day
    ]
    return in_force[-1].price if in_force else None

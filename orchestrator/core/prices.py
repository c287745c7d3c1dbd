"""What a model call costs: a small price table per model, for a run's estimated cost.

The figures are list prices in US dollars per million tokens, as the providers' pricing pages
(`PRICES_SOURCE`) gave them around `PRICES_AS_OF` (standard tier, no batch or cache discount;
written down when this table was made, on a machine that could not reach those pages to check
them again). Prices change, and the default model of this version (`gemini-3.8-flash`) is not
in the table: a deployment's own prices (a discount, a model this table does not know) go in
`BATON_PRICES`, which wins over the table:
`BATON_PRICES='{"gemini-3.8-flash": {"input_usd_per_mtok": …, "output_usd_per_mtok": …}}'`.
A model in neither has no estimated cost: its calls are counted as not costed, and `status`
says so, rather than pretending they were free.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

PRICES_SOURCE = (
    "https://ai.google.dev/gemini-api/docs/pricing, https://openai.com/api/pricing, "
    "https://www.anthropic.com/pricing (standard tier, prompts up to 200k tokens)"
)
PRICES_AS_OF = "2025-07"


class ModelPrice(BaseModel):
    """One model's price per million tokens; thoughts are billed as output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)

    def cost_usd(self, prompt_tokens: int, output_tokens: int) -> float:
        """The price of one call of `prompt_tokens` in and `output_tokens` out."""
        return (
            prompt_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok
        ) / 1_000_000


def _price(input_usd: float, output_usd: float) -> ModelPrice:
    return ModelPrice(input_usd_per_mtok=input_usd, output_usd_per_mtok=output_usd)


PRICES: dict[str, ModelPrice] = {
    "gemini-2.5-pro": _price(1.25, 10.0),
    "gemini-2.5-flash": _price(0.30, 2.50),
    "gemini-2.5-flash-lite": _price(0.10, 0.40),
    "gemini-2.0-flash": _price(0.10, 0.40),
    "gemini-2.0-flash-lite": _price(0.075, 0.30),
    "openai/gpt-4.1": _price(2.0, 8.0),
    "openai/gpt-4.1-mini": _price(0.40, 1.60),
    "openai/gpt-4.1-nano": _price(0.10, 0.40),
    "anthropic/claude-sonnet-4-20250514": _price(3.0, 15.0),
    "anthropic/claude-3-5-haiku-20241022": _price(0.80, 4.0),
}
"""Model id (as stages name it, `orchestrator.core.providers`) → its list price."""


def price_of(model: str, overrides: Mapping[str, ModelPrice] | None = None) -> ModelPrice | None:
    """The price of `model`: the deployment's (`BATON_PRICES`), else the table's, else None
    (its cost is not estimated)."""
    if overrides and model in overrides:
        return overrides[model]
    return PRICES.get(model)

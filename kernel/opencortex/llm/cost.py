"""What a turn cost: token usage priced with the `[llm.prices]` table (USD per million tokens)."""

from __future__ import annotations

from typing import Mapping

from opencortex.llm.base import PromptRequest, Usage, estimate_tokens
from opencortex.llm.settings import Price

CACHE_WRITE_FACTOR = 1.25
CACHE_READ_FACTOR = 0.1


def price_for(model: str, prices: Mapping[str, Price]) -> Price | None:
    """MODEL's price: an exact entry, else the longest entry MODEL starts with
    ("claude-haiku-4-5-20251001" is priced as "claude-haiku-4-5"); None if unknown."""
    if model in prices:
        return prices[model]
    prefixes = [name for name in prices if model.startswith(name)]
    return prices[max(prefixes, key=len)] if prefixes else None


def estimate_cost(usage: Usage, prices: Mapping[str, Price]) -> float | None:
    """USAGE in US dollars, or None when the model has no price.

    `usage.input_tokens` counts every prompt token; the cache reads and writes
    among them are priced at the cache prices.
    """
    price = price_for(usage.model, prices)
    if price is None:
        return None
    write = price.cache_write if price.cache_write is not None \
        else price.input * CACHE_WRITE_FACTOR
    read = price.cache_read if price.cache_read is not None else price.input * CACHE_READ_FACTOR
    plain = max(0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens)
    dollars = (plain * price.input + usage.cache_write_tokens * write
               + usage.cache_read_tokens * read + usage.output_tokens * price.output)
    return round(dollars / 1_000_000, 8)


def cut_reply_usage(request: PromptRequest, streamed: str, model: str,
                    prices: Mapping[str, Price]) -> Usage:
    """What a reply cut off after STREAMED cost, as far as it can be told: the provider
    was paid for the prompt and what it sent, but its count never came (estimated)."""
    usage = Usage(input_tokens=request.estimated_tokens(),
                  output_tokens=estimate_tokens(streamed), model=model, stop_reason="cut",
                  estimated=True)
    usage.cost_usd = estimate_cost(usage, prices)
    return usage

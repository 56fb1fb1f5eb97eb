"""The `[llm]` table of the configuration: providers, the model table, prices, limits.

This module imports nothing of opencortex, so `config.py` can hold one
`llm: LLMSettings` field.  The layout, every key optional:

    [llm]
    model = "…"              # beats the model table for every turn (`--model` sets it)
    fallback_to_echo = true  # provider unreachable → answer with echo, saying so
    max_tokens = 4096        # output cap unless a model-table row says otherwise
    temperature = 0.7        # unset: the server's default (OpenAI-compatible servers only)
    connect_timeout = 10     # seconds to connect
    first_chunk_timeout = 60 # seconds until the first text of a reply
    stall_timeout = 30       # seconds without text once a reply streams
    retries = 2              # extra attempts on 429 / 529 / 5xx before any text came
    retry_base_delay = 1.0   # backoff: 1 s, 2 s, 4 s … (with jitter) unless retry-after says
    retry_max_wait = 20      # a retry-after longer than this is not waited for

    [llm.anthropic]          # model, base_url (else $ANTHROPIC_BASE_URL), api_key_env, prompt_cache,
                             # thinking ("adaptive", "disabled" or a budget of tokens)
    [llm.openai]             # model, base_url (else $OPENAI_BASE_URL), api_key_env, stream_usage

    [[llm.models]]           # who is asking decides the model (see routing.py)
    archetype = "guest"
    channel = "telegram"
    model = "claude-haiku-4-5"
    max_tokens = 512

    [llm.owners]             # bridge chats that are not guests
    "telegram:12345" = "developer"

    [llm.prices]             # USD per million tokens; extends the built-in table
    "claude-sonnet-4-6" = { input = 3.0, output = 15.0 }
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]*$",
                                        max_length=200)]

ANTHROPIC_LARGE = "claude-opus-4-7"
ANTHROPIC_DEFAULT = "claude-sonnet-4-6"
ANTHROPIC_SMALL = "claude-haiku-4-5"
OPENAI_DEFAULT = "gpt-4o-mini"
OFFICIAL_OPENAI_URL = "https://api.openai.com/v1"


class AnthropicSettings(BaseModel):
    """The Anthropic Messages API."""

    model_config = ConfigDict(extra="forbid")

    model: str = ANTHROPIC_DEFAULT
    base_url: str | None = None  # default: $ANTHROPIC_BASE_URL, else the SDK's own
    api_key_env: str = "ANTHROPIC_API_KEY"
    prompt_cache: bool = True  # mark the system prompt (mandate, formats, persona) cacheable
    # Claude's thinking: "adaptive" (it decides), "disabled", or a budget of tokens (at
    # least 1,024, below the reply's max_tokens); unset: the model's own default.
    thinking: Literal["adaptive", "disabled"] | Annotated[int, Field(ge=1024)] | None = None


class OpenAISettings(BaseModel):
    """Any OpenAI-compatible chat-completions server (OpenAI, Ollama, llama.cpp, vLLM …)."""

    model_config = ConfigDict(extra="forbid")

    model: str = OPENAI_DEFAULT
    base_url: str | None = None  # default: $OPENAI_BASE_URL, else the official API
    api_key_env: str = "OPENAI_API_KEY"  # optional for servers other than the official API
    stream_usage: bool = True  # ask for token counts in the stream (stream_options)


class ModelRoute(BaseModel):
    """One row of the model table: WHEN (archetype, skill, channel, backend, tier) → WHAT.

    An omitted condition matches anything; of the matching rows the one with the
    most conditions wins, the first in the file among equals.  An omitted model
    means the provider's `model`; an omitted cap or temperature, `[llm]`'s.
    `tier = "short"` rows apply when a budget is nearly used up (see `budgets`).
    """

    model_config = ConfigDict(extra="forbid")

    archetype: Name | None = None
    skill: Name | None = None
    channel: Name | None = None
    backend: Name | None = None
    tier: Name | None = None
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)

    @property
    def conditions(self) -> int:
        return sum(v is not None for v in (self.archetype, self.skill, self.channel, self.backend,
                                           self.tier))

    def matches(self, *, backend: str, archetype: str, skill: str | None,
                channel: str | None, tier: str | None = None) -> bool:
        wanted = {"backend": backend, "archetype": archetype, "skill": skill, "channel": channel,
                  "tier": tier}
        return all(getattr(self, key) in (None, value) for key, value in wanted.items())


class Price(BaseModel):
    """USD per million tokens; cache prices default to 1.25× and 0.1× the input price."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    cache_read: float | None = Field(default=None, ge=0)


def default_model_table() -> list[ModelRoute]:
    """Owner (developer) gets the large model; guests a small one with short replies;
    the short-answer tier of a nearly used budget, the small model (first: it wins ties)."""
    return [
        ModelRoute(tier="short", backend="anthropic", model=ANTHROPIC_SMALL),
        ModelRoute(archetype="developer", backend="anthropic", model=ANTHROPIC_LARGE),
        ModelRoute(archetype="guest", backend="anthropic", model=ANTHROPIC_SMALL,
                   max_tokens=1024),
        ModelRoute(archetype="guest", max_tokens=1024),
        ModelRoute(archetype="system", backend="anthropic", model=ANTHROPIC_SMALL),
    ]


def default_prices() -> dict[str, Price]:
    """Published list prices when this was written; check your provider's page."""
    return {
        "claude-opus-4-7": Price(input=5.0, output=25.0),
        "claude-opus-4-6": Price(input=5.0, output=25.0),
        "claude-opus-4-5": Price(input=5.0, output=25.0),
        "claude-sonnet-4-6": Price(input=3.0, output=15.0),
        "claude-sonnet-4-5": Price(input=3.0, output=15.0),
        "claude-haiku-4-5": Price(input=1.0, output=5.0),
        "gpt-4o-mini": Price(input=0.15, output=0.60, cache_read=0.075),
        "gpt-4o": Price(input=2.5, output=10.0, cache_read=1.25),
    }


class LLMSettings(BaseModel):
    """Everything about talking to a model, typed and checked."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    fallback_to_echo: bool = True
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    connect_timeout: float = Field(default=10.0, gt=0)
    first_chunk_timeout: float = Field(default=60.0, gt=0)
    stall_timeout: float = Field(default=30.0, gt=0)
    retries: int = Field(default=2, ge=0, le=10)
    retry_base_delay: float = Field(default=1.0, ge=0)
    retry_max_wait: float = Field(default=20.0, ge=0)
    anthropic: AnthropicSettings = Field(default_factory=AnthropicSettings)
    openai: OpenAISettings = Field(default_factory=OpenAISettings)
    models: list[ModelRoute] = Field(default_factory=default_model_table)
    owners: dict[str, Name] = Field(default_factory=dict)
    prices: dict[str, Price] = Field(default_factory=default_prices)

    @field_validator("prices", mode="before")
    @classmethod
    def _prices_extend_the_defaults(cls, given: object) -> object:
        if isinstance(given, dict):
            return {**default_prices(), **given}
        return given

    @field_validator("owners")
    @classmethod
    def _owner_keys_are_threads(cls, owners: dict[str, str]) -> dict[str, str]:
        for key in owners:
            if not re.fullmatch(r"[a-z]+:.+", key):
                raise ValueError(f"owner {key!r} is not CHANNEL:CHAT-ID (or CHANNEL:*)")
        return owners

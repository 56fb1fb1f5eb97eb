"""Conversation settings: the context budget, compression, recall, owners and limits."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opencortex.conversation.compression import STRATEGIES
from opencortex.conversation.similarity import similarity_from_name

StrategyName = Literal["sliding", "forget", "summarize", "galois"]
assert set(get_args(StrategyName)) == set(STRATEGIES)


class ConversationSettings(BaseModel):
    """How conversations are kept: one `[conversation]` table in the config file."""

    model_config = ConfigDict(extra="forbid")

    budget: int = Field(8000, gt=0)            # tokens the working context may use
    threshold: float = Field(0.8, gt=0, le=1)  # compress when pressure passes this
    target: float = Field(0.6, gt=0, lt=1)     # ... down to this (below threshold)
    strategy: StrategyName = "sliding"
    tolerance: float = Field(0.25, ge=0, le=1)  # galois: the semantic loss allowed
    similarity: str = "lexical"                 # or "embedding:<model>" (sentence-transformers)
    recall_k: int = Field(5, ge=0)              # earlier messages recalled per turn
    max_turns: int | None = Field(None, gt=0)   # a session collapses after this many turns
    max_tokens: int | None = Field(None, gt=0)  # ... or after this many tokens
    owners: dict[str, str] = Field(default_factory=dict)  # thread "telegram:123" -> owner name
    recall_across_owners: list[str] = Field(default_factory=list)  # owners others may recall from
    show_thoughts: bool = False

    @field_validator("similarity")
    @classmethod
    def _known_similarity(cls, value: str) -> str:
        similarity_from_name(value)  # ValueError with the accepted forms
        return value

    @field_validator("owners")
    @classmethod
    def _owner_names(cls, value: dict[str, str]) -> dict[str, str]:
        for thread, owner in value.items():
            if ":" not in thread or not thread.split(":", 1)[1]:
                raise ValueError(f"owners key {thread!r} must be a thread 'channel:chat-id', "
                                 "e.g. 'telegram:123'")
            if not owner.strip():
                raise ValueError(f"owner name for thread {thread!r} is empty")
        return value

    @model_validator(mode="after")
    def _target_below_threshold(self) -> "ConversationSettings":
        if self.target >= self.threshold:
            raise ValueError(f"target ({self.target}) must be below threshold ({self.threshold}), "
                             "or compressions would thrash")
        return self

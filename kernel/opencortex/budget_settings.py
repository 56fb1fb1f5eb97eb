"""The `[budget]` table of the configuration: token and cost budgets per archetype.

Every key is optional; with no archetype table nobody has a budget.

    [budget]
    short_at = 0.8            # from this share of a budget on: the short-answer tier
    short_max_tokens = 256    # output cap of a reply in the short-answer tier
    extend_by = 20000         # tokens an owner's "yes" adds when a budget is used up
    session_warn_at = 0.9     # announce a session's collapse (max_turns/max_tokens) from here

    [budget.guest]            # who: an observer archetype (see llm/routing.archetype_for)
    renew = "daily"           # "daily" (at 00:00 UTC) or "never"
    session_tokens = 20000    # per thread
    session_cost_usd = 0.05
    owner_tokens = 50000      # per owner, summed over the owner's threads
    owner_cost_usd = 0.10

This module imports nothing of opencortex, so `config.py` can hold one field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ArchetypeBudget(BaseModel):
    """The limits of one archetype; an omitted limit is no limit."""

    model_config = ConfigDict(extra="forbid")

    renew: Literal["daily", "never"] = "daily"
    session_tokens: int | None = Field(default=None, gt=0)
    session_cost_usd: float | None = Field(default=None, gt=0)
    owner_tokens: int | None = Field(default=None, gt=0)
    owner_cost_usd: float | None = Field(default=None, gt=0)

    def limits(self, scope: Literal["session", "owner"]) -> tuple[int | None, float | None]:
        """(tokens, cost) limits of SCOPE."""
        if scope == "session":
            return self.session_tokens, self.session_cost_usd
        return self.owner_tokens, self.owner_cost_usd


class BudgetSettings(BaseModel):
    """Budgets by archetype, and how the kernel behaves as one runs out."""

    model_config = ConfigDict(extra="allow")

    short_at: float = Field(default=0.8, gt=0, lt=1)
    short_max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    extend_by: int = Field(default=20_000, ge=1)
    session_warn_at: float = Field(default=0.9, gt=0, lt=1)

    @model_validator(mode="after")
    def _archetypes_are_budgets(self) -> "BudgetSettings":
        extra = self.__pydantic_extra__ or {}
        for name, value in list(extra.items()):
            if not isinstance(value, (dict, ArchetypeBudget)):
                raise ValueError(f"[budget] {name} must be a table of limits "
                                 f"([budget.{name}]), not {type(value).__name__}")
            extra[name] = ArchetypeBudget.model_validate(value)
        return self

    def for_archetype(self, archetype: str) -> ArchetypeBudget | None:
        """The budget of ARCHETYPE, or None when it has none."""
        found = (self.__pydantic_extra__ or {}).get(archetype)
        return found if isinstance(found, ArchetypeBudget) else None

"""What a turn produced, how a frontend follows one, and a thread's running figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from opencortex.events import Thread
from opencortex.ids import random_uuid
from opencortex.llm import Usage
from opencortex.verification import jsonable

def new_turn_id() -> str:
    return random_uuid().hex[:16]


class TurnFailed(Exception):
    """A turn stops here; the message is what the person is told.  RETRY_AFTER_SECONDS:
    when trying again makes sense (a provider's rate limit, a budget's renewal)."""

    def __init__(self, message: str, *, retry_after_seconds: float | None = None):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


Status = Literal["done", "needs-approval", "rejected", "failed", "no-skill", "aborted"]


class TurnObserver:
    """What a frontend may follow of a turn while it runs (default: nothing)."""

    def on_chunk(self, text: str) -> None:
        """A streamed piece of the raw model reply."""

    def on_thinking(self, text: str, fresh: bool) -> None:
        """A streamed piece of a reasoning model's thinking (model text: untrusted, never
        part of the reply); FRESH: the model thinks anew (a retried request, or the
        next reply asked for), so what was shown of its thinking before goes."""

    def on_reply_done(self) -> None:
        """The model finished one reply; verification and actuation follow."""


@dataclass
class TurnResult:
    """What one turn did, for frontends and `--json`."""

    thread: Thread
    status: Status
    backend: str
    turn_id: str = field(default_factory=new_turn_id)
    text: str | None = None
    action: dict[str, Any] | None = None
    skill: str | None = None
    ids: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    usage: Usage | None = None
    retry_after_seconds: float | None = None   # a failed turn: when to try again
    attempts: int = 0
    steps: list[Any] = field(default_factory=list)   # the tool loop's `opencortex.steps.Step`s
    pinned: bool = False   # archive the turn pinned (its skill has :pins-turn)
    elapsed_s: float = 0.0
    started: float = 0.0  # perf_counter() when the turn got its thread

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "turn_id": self.turn_id, "text": self.text,
                "action": jsonable(self.action),
                "backend": self.backend, "thread": str(self.thread), "skill": self.skill,
                "ids": self.ids, "warnings": self.warnings, "errors": self.errors,
                "usage": self.usage.model_dump() if self.usage else None,
                "attempts": self.attempts, "elapsed_s": round(self.elapsed_s, 6),
                "steps": [{"call": step.call, "outcome": step.outcome} for step in self.steps],
                **({"retry_after_seconds": self.retry_after_seconds}
                   if self.retry_after_seconds is not None else {})}


MAX_THREAD_STATS = 4096    # threads whose running figures are kept (the most recent)


@dataclass
class ThreadStats:
    """Running figures for a thread's status line."""

    turns: int = 0
    total_latency_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_turns: int = 0  # turns whose model has no price: the cost is a lower bound

    @property
    def average_latency_ms(self) -> float:
        return 1000 * self.total_latency_s / self.turns if self.turns else 0.0


class RecentThreadStats(dict):
    """`ThreadStats` by thread, for the MAX_THREAD_STATS threads that had a turn most
    recently: a kernel that strangers reach on a bridge meets new threads without end,
    so the figures of the longest quiet ones are let go (they start again at 0)."""

    def of(self, thread) -> ThreadStats:
        """THREAD's figures, made when new, now the most recent."""
        stats = self.pop(thread, None)
        if stats is None:
            stats = ThreadStats()
            while len(self) >= MAX_THREAD_STATS:
                del self[next(iter(self))]
        self[thread] = stats
        return stats

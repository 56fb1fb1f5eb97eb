"""A thread's session lifecycle: checked state transitions, turn and token counters.

States::

    dormant    nothing loaded yet (after a restart, or when put to sleep)
    ready      waiting for the next user message
    streaming  a reply is being produced
    waiting    a reply waits for the user's approval of an action
    draining   a reply is being finished or cancelled; nothing new starts
    collapsed  a turn limit or budget is used up (the reason says which); only reset() leaves it

An invalid transition raises `InvalidTransition` instead of changing anything.
"""

from __future__ import annotations

from typing import Literal, get_args

from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory.records import check_thread

SessionState = Literal["dormant", "ready", "streaming", "waiting", "draining", "collapsed"]
SESSION_STATES: tuple[str, ...] = get_args(SessionState)

ALLOWED: dict[str, frozenset[str]] = {
    "dormant": frozenset({"ready"}),
    "ready": frozenset({"streaming", "dormant"}),
    "streaming": frozenset({"waiting", "ready", "draining"}),
    "waiting": frozenset({"streaming", "ready", "draining"}),
    "draining": frozenset({"ready", "dormant"}),
    "collapsed": frozenset(),
}
"""Transitions `Session.to` allows, besides any state -> collapsed."""


class InvalidTransition(RuntimeError):
    """A session was asked to move between two states that are not connected."""


class Session:
    """One thread's lifecycle; transitions are checked."""

    def __init__(self, thread: Thread, *, state: SessionState = "dormant"):
        if state not in SESSION_STATES:
            raise ValueError(f"unknown session state {state!r}; use one of "
                             + ", ".join(SESSION_STATES))
        self.thread = check_thread(thread)
        self.state: SessionState = state
        self.turns = 0
        self.tokens = 0
        self.collapse_reason: str | None = None

    def __repr__(self) -> str:
        return (f"Session({self.thread}, state={self.state}, turns={self.turns}, "
                f"tokens={self.tokens})")

    def can_go(self, state: str) -> bool:
        """True when `to(STATE)` would be allowed now."""
        return state == "collapsed" or state in ALLOWED.get(self.state, ())

    def to(self, state: SessionState) -> None:
        """Move to STATE, or raise InvalidTransition ("cannot go from X to Y")."""
        if state not in SESSION_STATES:
            raise ValueError(f"unknown session state {state!r}; use one of "
                             + ", ".join(SESSION_STATES))
        if not self.can_go(state):
            hint = " (use reset)" if self.state == "collapsed" else ""
            raise InvalidTransition(f"cannot go from {self.state} to {state}{hint}")
        if state == "collapsed" and self.collapse_reason is None:
            self.collapse_reason = "the session was closed"
        self.state = state

    def collapse(self, reason: str) -> None:
        """Move to collapsed (from any state) and remember why; the first reason stays."""
        if self.collapse_reason is None:
            self.collapse_reason = reason
        self.state = "collapsed"

    def count_turn(self, tokens: int, *, max_turns: int | None = None,
                   max_tokens: int | None = None) -> str | None:
        """Count a finished turn of TOKENS tokens; collapse when a limit is used up.

        Returns the reason when the session is (now or already) collapsed, else None.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens must be a whole number >= 0, not {tokens!r}")
        if self.state == "collapsed":
            return self.collapse_reason
        self.turns += 1
        self.tokens += tokens
        reason = self.exhausted(max_turns=max_turns, max_tokens=max_tokens)
        if reason is not None:
            self.collapse(reason)
        return reason

    def exhausted(self, *, max_turns: int | None = None,
                  max_tokens: int | None = None) -> str | None:
        """Why the counters have reached a limit, or None when they have not."""
        if max_turns is not None and self.turns >= max_turns:
            return (f"this session reached its limit of {max_turns} turns; "
                    "use /reset to start again")
        if max_tokens is not None and self.tokens >= max_tokens:
            return (f"this session used {self.tokens:,} of its {max_tokens:,} tokens; "
                    "use /reset to start again")
        return None

    def reset(self) -> None:
        """Back to ready with counters at zero (the only way out of collapsed)."""
        self.state = "ready"
        self.turns = 0
        self.tokens = 0
        self.collapse_reason = None

    @classmethod
    def from_log(cls, log: ThreadLog, *, max_turns: int | None = None,
                 max_tokens: int | None = None) -> Session:
        """Rebuild a session after a restart from its thread log's current branch.

        Turns are the branch's turns; tokens are the TOKENS_IN + TOKENS_OUT the
        kernel wrote on their records (missing or unreadable counts are 0).  The
        session is dormant, or collapsed when a limit is already used up.  Both
        counts are kept by the log, so this costs nothing per turn of history.
        """
        session = cls(log.thread)
        session.turns = log.turn_count()
        session.tokens = log.head_tokens()
        reason = session.exhausted(max_turns=max_turns, max_tokens=max_tokens)
        if reason is not None:
            session.collapse(reason)
        return session


"""Wire sessions: the sequence numbers and the replay buffer that outlive a connection.

A session is issued when a client authenticates.  Every event the kernel sends
to it takes the session's next sequence number and, except heartbeats and the
`session` event itself, is kept in a bounded replay buffer (by count and by
bytes).  A client that reconnects presents its session id and the last
sequence it saw; it gets every kept event after that one, in order, then the
live stream: nothing twice, nothing skipped unless the buffer had to drop it
(the `session` event then says `gap: true`).

All of this runs on the kernel's event loop: attaching a connection (replay
included) happens in one step, so no event can slip in between.  A session
without a connection is kept for `ttl` seconds; the book holds at most
`max_sessions`, dropping the longest-detached idle one first.
"""

from __future__ import annotations

import collections
import secrets
import time
from typing import TYPE_CHECKING, Any, Protocol

from opencortex.wire_protocol import event_frame

if TYPE_CHECKING:
    from opencortex.wire_turns import TurnContext


class Outlet(Protocol):
    """Where a session's frames go while a client is attached (a connection)."""

    def enqueue(self, frame: bytes) -> None:
        """Queue FRAME for sending; never blocks."""

    def close_soon(self, code: int, reason: str) -> None:
        """Close the connection (from the loop, without waiting)."""


class TooManySessions(RuntimeError):
    """Every session slot is held by an attached or busy session."""


class WireSession:
    """One client's session: sequence, replay buffer, turns and approvals in flight."""

    def __init__(self, *, replay_events: int, replay_bytes: int):
        self.id = secrets.token_urlsafe(18)
        self.sequence = 0
        self.replay_events = replay_events
        self.replay_bytes = replay_bytes
        self._replay: collections.deque[tuple[int, bytes]] = collections.deque()
        self._replay_size = 0
        self.dropped_through = 0          # the highest sequence evicted from the buffer
        self.outlet: Outlet | None = None
        self.detached_at: float | None = time.monotonic()
        self.turns: dict[str, "TurnContext"] = {}        # by correlation id, arrival order
        self.approvals: dict[str, str] = {}             # approval id -> digest
        self.recent: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def busy(self) -> bool:
        """Whether turns or approvals of this session are still in flight."""
        return bool(self.turns or self.approvals)

    def emit(self, event: str, data: dict[str, Any], *, replay: bool = True) -> int:
        """Send EVENT to the attached client (if any), keeping it for a resume when
        REPLAY; its sequence number."""
        self.sequence += 1
        frame = event_frame(event, self.sequence, data)
        if replay:
            self._keep(self.sequence, frame)
        if self.outlet is not None:
            self.outlet.enqueue(frame)
        return self.sequence

    def _keep(self, sequence: int, frame: bytes) -> None:
        self._replay.append((sequence, frame))
        self._replay_size += len(frame)
        while self._replay and (len(self._replay) > self.replay_events
                                or self._replay_size > self.replay_bytes):
            dropped, old = self._replay.popleft()
            self._replay_size -= len(old)
            self.dropped_through = dropped

    def attach(self, outlet: Outlet, last_sequence: int) -> tuple[int, bool]:
        """Make OUTLET this session's client and replay what came after LAST_SEQUENCE:
        (events replayed, whether some were lost).  A connection that held the
        session before is closed."""
        if last_sequence > self.sequence:
            raise ValueError(f"last_sequence {last_sequence} is ahead of this session "
                             f"(its last event is {self.sequence})")
        previous, self.outlet, self.detached_at = self.outlet, outlet, None
        if previous is not None and previous is not outlet:
            previous.close_soon(4000, "this session was resumed by another connection")
        missed = [frame for sequence, frame in self._replay if sequence > last_sequence]
        for frame in missed:
            outlet.enqueue(frame)
        return len(missed), last_sequence < self.dropped_through

    def detach(self, outlet: Outlet) -> None:
        """OUTLET is gone; the session waits for a resume."""
        if self.outlet is outlet:
            self.outlet = None
            self.detached_at = time.monotonic()

    def remember_correlation(self, correlation_id: str, limit: int = 256) -> bool:
        """Record CORRELATION_ID; False when this session used it already (recently)."""
        if correlation_id in self.recent:
            return False
        self.recent[correlation_id] = None
        while len(self.recent) > limit:
            self.recent.popitem(last=False)
        return True


class SessionBook:
    """The sessions of one wire server, by id."""

    def __init__(self, *, ttl: float, max_sessions: int, replay_events: int,
                 replay_bytes: int):
        self.ttl = ttl
        self.max_sessions = max_sessions
        self.replay_events = replay_events
        self.replay_bytes = replay_bytes
        self.sessions: dict[str, WireSession] = {}

    def new(self) -> WireSession:
        """A fresh session; TooManySessions when none can be made room for."""
        self.sweep()
        if len(self.sessions) >= self.max_sessions:
            idle = [s for s in self.sessions.values()
                    if s.detached_at is not None and not s.busy]
            if not idle:
                raise TooManySessions(f"the kernel holds {self.max_sessions} wire sessions "
                                      "already (its limit)")
            oldest = min(idle, key=lambda s: s.detached_at or 0.0)
            del self.sessions[oldest.id]
        session = WireSession(replay_events=self.replay_events, replay_bytes=self.replay_bytes)
        self.sessions[session.id] = session
        return session

    def find(self, session_id: str) -> WireSession | None:
        """The live session SESSION_ID, or None when unknown or expired."""
        self.sweep()
        return self.sessions.get(session_id)

    def sweep(self, now: float | None = None) -> None:
        """Forget sessions detached for longer than the ttl with nothing in flight."""
        now = time.monotonic() if now is None else now
        for session in list(self.sessions.values()):
            if (session.detached_at is not None and not session.busy
                    and now - session.detached_at > self.ttl):
                del self.sessions[session.id]

    def all(self) -> list[WireSession]:
        return list(self.sessions.values())

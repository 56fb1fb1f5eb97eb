"""How a wire turn reaches its client: streamed chunks, the reply, approvals, errors.

Wire turns run on the kernel's "cli" channel (thread ``cli:<name>``): a local
channel only the owner types into, so the owner's routing, approvals and the
reply pinning rule (`opencortex.pinning`: a ``:target :cli`` reply stays in
its own conversation) hold unchanged, with no new channel or action type.  What
makes the reply go to the right client is `current_turn`: each turn's task runs
with it set to its `TurnContext` (tasks the kernel starts inside inherit it),
so `WireActuator` and `WireApprover` know whose turn it is; outside a wire
turn they hand over to what served "cli" before (the terminal printer).

- `ChunkStream` follows the turn (`TurnObserver`): the words of the reply's
  ``:text`` as they arrive, coalesced into ``chunk`` events: the first words
  at once, then at most one event per `coalesce_seconds` (more only when
  `max_chars` characters are waiting); the last chunk of an attempt says
  ``final: true``; a retry after a rejected reply streams anew with the next
  ``attempt`` number.  A reasoning model's thinking comes the same way as
  ``thinking`` events (``text``, ``attempt``, ``fresh``: the model thinks anew,
  what was shown of its thinking goes), coalesced apart from the words.
- `WireActuator` keeps what the kernel says during the turn; the service sends
  it as ``message`` / ``error`` events when the turn ends, when the tokens it
  used are known.
- `WireApprover` sends an ``approval`` event (kernel facts only) and waits for
  ``approve`` / ``deny`` from that session.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any

from opencortex.actions import Action
from opencortex.actuators import Actuator, ActuatorError, MessageActuator, Outcome
from opencortex.approvals import ApprovalBook, ApprovalDecision, ApprovalRequest, Approver
from opencortex.events import Event, Thread
from opencortex.streaming import TextExtractor
from opencortex.turn import TurnObserver, TurnResult
from opencortex.wire_protocol import error_data
from opencortex.wire_session import WireSession

LLM_CODES = ("RATE_LIMITED", "STREAM_TIMEOUT", "LLM_UNAVAILABLE", "INVALID_MESSAGE",
             "SESSION_EXPIRED")
FAILED = ("failed", "rejected", "no-skill")
ERROR_PREFIX = "System Error: "

current_turn: contextvars.ContextVar["TurnContext | None"] = \
    contextvars.ContextVar("opencortex_wire_turn", default=None)


@dataclass(eq=False)
class TurnContext:
    """One wire turn: whose it is, and what it said so far."""

    session: WireSession
    turn_id: str
    correlation_id: str
    thread: Thread
    said: list[tuple[str, str]] = field(default_factory=list)  # ("message" | "error", text)
    acting: bool = False          # the verified reply is being carried out: too late to abort
    finished: bool = False        # the turn's end was reported
    approvals: set[str] = field(default_factory=set)
    chunks: int = 0
    task: "asyncio.Task[TurnResult] | None" = None

    def emit(self, event: str, data: dict[str, Any]) -> int:
        """Send EVENT to this turn's session, naming the turn."""
        return self.session.emit(event, {"turn_id": self.turn_id,
                                         "correlation_id": self.correlation_id, **data})

    def say(self, kind: str, text: str) -> None:
        """Keep TEXT for the turn's end; once that was reported, send it at once."""
        if not self.finished:
            self.said.append((kind, text))
        elif kind == "message":
            self.emit("message", {"content": text, "tokens_used": 0, "notice": True})
        else:
            self.emit("error", error_data("TURN_FAILED", plain(text),
                                          correlation_id=self.correlation_id,
                                          turn_id=self.turn_id))


class ChunkStream(TurnObserver):
    """The reply's words as ``chunk`` events, and the model's thinking as ``thinking``
    events, coalesced (what is pending is of one KIND: the other flushes it first)."""

    def __init__(self, turn: TurnContext, *, coalesce_seconds: float, max_chars: int):
        self.turn = turn
        self.coalesce_seconds = coalesce_seconds
        self.max_chars = max_chars
        self.loop = asyncio.get_running_loop()
        self.extractor = TextExtractor()
        self.attempt = 1
        self.reply_done = False
        self.streamed = False       # this attempt sent a chunk
        self.pending: list[str] = []
        self.kind = "chunk"         # of what is pending
        self.fresh = False          # the next thinking event starts the thinking anew
        self.timer: asyncio.TimerHandle | None = None
        self.pending_chars = 0
        self.last_flush = float("-inf")

    def on_chunk(self, text: str) -> None:
        if self.reply_done:
            self._next_attempt()
        delta = self.extractor.feed(text)
        if delta:
            self._add("chunk", delta)

    def on_thinking(self, text: str, fresh: bool) -> None:
        if self.reply_done:
            self._next_attempt()
        if fresh:
            if self.kind == "thinking" and self.pending:
                self.flush()
            self.fresh = True
        self._add("thinking", text)

    def _next_attempt(self) -> None:
        """The reply was rejected (or the tool loop asks again): the next streams anew."""
        self.reply_done, self.streamed = False, False
        self.attempt += 1
        self.extractor = TextExtractor()

    def _add(self, kind: str, text: str) -> None:
        if kind != self.kind:
            if self.pending:
                self.flush()
            self.kind = kind
        self.pending.append(text)
        self.pending_chars += len(text)
        if self.timer is not None:
            if self.pending_chars >= self.max_chars:
                self.flush()
            return
        wait = self.last_flush + self.coalesce_seconds - self.loop.time()
        if wait <= 0:
            self.flush()                # the first words go out at once
        else:
            self.timer = self.loop.call_later(wait, self.flush)

    def on_reply_done(self) -> None:
        self.reply_done = True
        if self.kind == "thinking":
            if self.pending:
                self.flush()
            self.kind = "chunk"
        if self.pending or self.streamed:
            self.flush(final=True)

    def flush(self, final: bool = False) -> None:
        """Send what is pending (the attempt's last chunk when FINAL)."""
        self.cancel_timer()
        self.last_flush = self.loop.time()
        text, self.pending, self.pending_chars = "".join(self.pending), [], 0
        pieces = [text[i:i + self.max_chars] for i in range(0, len(text), self.max_chars)]
        if self.kind == "thinking":
            for piece in pieces:
                self.turn.emit("thinking", {"text": piece, "attempt": self.attempt,
                                            "fresh": self.fresh})
                self.fresh = False
            return
        if final and not pieces:
            pieces = [""]
        for index, piece in enumerate(pieces):
            self.turn.chunks += 1
            self.streamed = True
            self.turn.emit("chunk", {"text": piece, "attempt": self.attempt,
                                     "final": final and index == len(pieces) - 1})

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        """The turn ended: nothing more is sent (text of an aborted stream is dropped)."""
        self.cancel_timer()
        self.pending, self.pending_chars = [], 0


class WireActuator(MessageActuator):
    """``:target :cli`` within a wire turn: what is said goes to that turn's client.
    Outside one, FALLBACK (the terminal printer) serves as before."""

    targets = ("cli",)

    def __init__(self, fallback: Actuator | None = None):
        self.fallback = fallback

    def _fallback(self) -> Actuator:
        if self.fallback is None:
            raise ActuatorError("no terminal is attached to this kernel; a :cli reply outside "
                                "a wire turn has nowhere to go")
        return self.fallback

    def saying(self, event: Event) -> None:
        turn = current_turn.get()
        if turn is not None:
            turn.acting = True

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        turn = current_turn.get()
        if turn is None:
            return await self._fallback().carry_out(action, event, key=key)
        turn.acting = True
        return await super().carry_out(action, event, key=key)

    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        turn = current_turn.get()
        if turn is not None:
            turn.say("message", text)
            return
        fallback = self._fallback()
        if not isinstance(fallback, MessageActuator):
            raise ActuatorError("the terminal printer cannot show text")
        await fallback.deliver(address, text, key)

    async def show_error(self, address: str, text: str) -> None:
        turn = current_turn.get()
        if turn is not None:
            turn.say("error", text)
            return
        fallback = self._fallback()
        if isinstance(fallback, MessageActuator):
            await fallback.show_error(address, text)

    async def aclose(self) -> None:
        if self.fallback is not None:
            await self.fallback.aclose()


class WireApprover(Approver):
    """Asks the client whose turn it is; outside a wire turn, FALLBACK (if any) asks."""

    def __init__(self, book: ApprovalBook, fallback: Approver | None = None):
        self.book = book
        self.fallback = fallback

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        turn = current_turn.get()
        if turn is None:
            if self.fallback is None:
                return ApprovalDecision("unavailable")
            return await self.fallback.ask(request)
        turn.acting = True
        session = turn.session
        self.book.open(request)
        session.approvals[request.id] = request.digest
        turn.approvals.add(request.id)
        turn.emit("approval", {"approval_id": request.id, "timeout_seconds": request.timeout,
                               "facts": request.facts()})
        try:
            return await self.book.wait(request)
        finally:
            session.approvals.pop(request.id, None)
            turn.approvals.discard(request.id)


def plain(text: str) -> str:
    """A kernel error TEXT without its "System Error: " heading or "CODE: " prefix."""
    text = text.removeprefix(ERROR_PREFIX)
    code, sep, rest = text.partition(": ")
    return rest if sep and code in LLM_CODES else text


def error_code(failure: str) -> str:
    """The wire code of a kernel failure: the LLM's ("CODE: …"), else TURN_FAILED."""
    code = failure.removeprefix(ERROR_PREFIX).partition(": ")[0]
    return code if code in LLM_CODES else "TURN_FAILED"


def turn_error(turn: TurnContext, result: TurnResult, shown: str | None, *,
               rate_limit_wait: float) -> dict[str, Any]:
    """The ``error`` data for a turn that failed (SHOWN: what the kernel said, if anything)."""
    failure = result.errors[0] if result.errors else (shown or f"the turn {result.status}")
    code = error_code(failure)
    wait = None
    if code == "RATE_LIMITED":   # the provider's or the budget's own word, else a hint
        wait = result.retry_after_seconds or rate_limit_wait
    return error_data(code, plain(shown or failure), correlation_id=turn.correlation_id,
                      turn_id=turn.turn_id, retry_after_seconds=wait)


def tokens_used(result: TurnResult) -> int:
    usage = result.usage
    return usage.input_tokens + usage.output_tokens if usage is not None else 0

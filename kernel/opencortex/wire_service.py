"""What a wire client's actions do: start, abort and answer turns, run slash commands.

Each ``message`` starts a turn of the kernel (`Kernel.handle`) as a task of
its own, with `opencortex.wire_turns.current_turn` set, and returns at once;
the turn's events follow: ``chunk`` while the reply streams, ``approval`` when
the kernel asks, then at its end ``message`` (the verified reply, with the
tokens it used) and/or ``error``, then ``done`` (its status and how many
chunks were sent), then ``status`` (the thread's view, as Emacs' header line
shows it).  Turns of one thread run in arrival order (the kernel's rule).

``abort`` cancels a turn that is still thinking (nothing of it is archived);
while the turn waits for an approval it denies the approval instead; once the
verified reply is being carried out it is too late, and the client is told so.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Coroutine

from opencortex.approvals import ApprovalBook
from opencortex.events import EventError, Thread, chat_message
from opencortex.kernel import Kernel
from opencortex.turn import TurnResult, new_turn_id
from opencortex.wire_protocol import ClientFrame, error_data
from opencortex.wire_session import WireSession
from opencortex.wire_turns import (FAILED, ChunkStream, TurnContext, current_turn, plain,
                                   tokens_used, turn_error)

log = logging.getLogger(__name__)

WIRE_HELP = "\n/status — this thread's status (a status event)"
CHANNEL = "cli"


@dataclass(frozen=True)
class TurnLimits:
    """What one session may have running, and how chunks are coalesced."""

    max_turns_per_session: int = 8
    busy_retry_seconds: float = 1.0        # retry_after_seconds when a session is at its limit
    rate_limit_wait: float = 20.0          # retry_after_seconds when a RATE_LIMITED names none
    coalesce_seconds: float = 0.025
    chunk_max_chars: int = 4096


class WireService:
    """Runs the actions of authenticated sessions on the kernel's loop."""

    def __init__(self, kernel: Kernel, book: ApprovalBook, limits: TurnLimits):
        self.kernel = kernel
        self.book = book
        self.limits = limits
        self.tasks: set[asyncio.Task[Any]] = set()     # status reports and commands

    def dispatch(self, session: WireSession, frame: ClientFrame) -> None:
        """Do FRAME's action for SESSION (an ``auth`` here is a mistake)."""
        data = frame.data
        if frame.action == "message":
            self.start_turn(session, data)
        elif frame.action == "abort":
            self.abort(session, data)
        elif frame.action in ("approve", "deny"):
            self.answer(session, data, frame.action == "approve")
        elif frame.action == "command":
            self.spawn(self.command(session, data))
        else:
            self.refuse(session, "this connection is authenticated already",
                        data.get("correlation_id"))

    def refuse(self, session: WireSession, message: str, correlation_id: str | None) -> None:
        """Answer a frame that cannot be used with INVALID_MESSAGE."""
        session.emit("error", error_data("INVALID_MESSAGE", message,
                                         correlation_id=correlation_id))

    # -- turns ------------------------------------------------------------------

    def start_turn(self, session: WireSession, data: dict[str, Any]) -> None:
        """Start a turn for DATA's message; its events follow as it runs."""
        given = data["correlation_id"]
        if len(session.turns) >= self.limits.max_turns_per_session:
            session.emit("error", error_data(
                "RATE_LIMITED", f"this session has {len(session.turns)} turns in flight "
                "(its limit); wait for one to finish", correlation_id=given,
                retry_after_seconds=self.limits.busy_retry_seconds))
            return
        try:
            event = chat_message(data["content"], CHANNEL, data["thread"])
        except EventError as error:
            self.refuse(session, str(error), given)
            return
        turn_id = new_turn_id()
        correlation = given or turn_id
        if not session.remember_correlation(correlation):
            self.refuse(session, f"correlation_id {correlation} was used already in this "
                        "session; use a new one for each message", given)
            return
        turn = TurnContext(session, turn_id, correlation, event.thread)
        stream = ChunkStream(turn, coalesce_seconds=self.limits.coalesce_seconds,
                             max_chars=self.limits.chunk_max_chars)
        context = contextvars.copy_context()
        context.run(current_turn.set, turn)
        turn.task = asyncio.get_running_loop().create_task(
            self.kernel.handle(event, stream, turn_id), context=context)
        session.turns[correlation] = turn
        turn.task.add_done_callback(partial(self._finished, turn, stream))

    def _finished(self, turn: TurnContext, stream: ChunkStream,
                  task: "asyncio.Task[TurnResult]") -> None:
        """Report the end of TURN: its messages and errors, ``done``, then ``status``."""
        stream.close()
        turn.session.turns.pop(turn.correlation_id, None)
        warnings: list[str] = []
        if task.cancelled():
            status = "aborted"
        elif task.exception() is not None:
            log.error("a wire turn failed unexpectedly: %s", type(task.exception()).__name__)
            status = "failed"
            turn.emit("error", {"code": "TURN_FAILED", "message": (
                f"kernel error ({type(task.exception()).__name__}); nothing of this turn was "
                "kept. See the kernel's log.")})
        else:
            result = task.result()
            status, warnings = result.status, result.warnings
            self._report(turn, result)
        turn.finished = True
        turn.emit("done", {"status": status, "total_chunks": turn.chunks, "warnings": warnings})
        self.spawn(self.send_status(turn.session, turn.thread, turn.correlation_id,
                                    turn.turn_id))

    def _report(self, turn: TurnContext, result: TurnResult) -> None:
        """What the kernel said during TURN, in order: the reply (with the tokens the turn
        used), notices, errors."""
        replied = False
        errors = 0
        for kind, text in turn.said:
            if kind == "message":
                primary = not replied and text == result.text
                replied = replied or primary
                turn.emit("message", {"content": text, "notice": not primary,
                                      "tokens_used": tokens_used(result) if primary else 0})
            else:
                turn.emit("error", self._error(turn, result, text, first=errors == 0))
                errors += 1
        if not errors and result.status in FAILED:
            turn.emit("error", self._error(turn, result, None, first=True))

    def _error(self, turn: TurnContext, result: TurnResult, shown: str | None, *,
               first: bool) -> dict[str, Any]:
        if first:
            return turn_error(turn, result, shown, rate_limit_wait=self.limits.rate_limit_wait)
        return error_data("TURN_FAILED", plain(shown or ""), correlation_id=turn.correlation_id,
                          turn_id=turn.turn_id)

    def abort(self, session: WireSession, data: dict[str, Any]) -> None:
        """Abort one of SESSION's turns (see the module docstring)."""
        correlation, thread = data["correlation_id"], data["thread"]
        if correlation is not None:
            turn = session.turns.get(correlation)
        else:
            turn = next((t for t in session.turns.values()
                         if thread is None or t.thread == Thread(CHANNEL, thread)), None)
        if turn is None or turn.task is None:
            self.refuse(session, "no turn of this session is in flight"
                        + (f" with correlation_id {correlation}" if correlation else ""),
                        correlation)
        elif turn.approvals:
            for approval_id in list(turn.approvals):
                self.book.answer(approval_id, False)
        elif turn.acting:
            self.refuse(session, "too late to abort: the verified reply is being carried out",
                        turn.correlation_id)
        else:
            turn.task.cancel()

    def answer(self, session: WireSession, data: dict[str, Any], approved: bool) -> None:
        """Approve or deny an approval this session was asked."""
        approval_id, digest = data["approval_id"], data["digest"]
        correlation = data["correlation_id"]
        if approval_id not in session.approvals:
            self.refuse(session, f"no approval {approval_id} is waiting in this session",
                        correlation)
        elif digest is not None and digest != session.approvals[approval_id]:
            self.refuse(session, "the digest does not match the action waiting for approval; "
                        "nothing was decided", correlation)
        elif not self.book.answer(approval_id, approved):
            self.refuse(session, f"approval {approval_id} was settled already", correlation)

    # -- commands and status ----------------------------------------------------

    async def command(self, session: WireSession, data: dict[str, Any]) -> None:
        """Run a slash command; its answer comes as a ``message`` event (no turn)."""
        content = data["content"]
        thread = Thread(CHANNEL, data["thread"])
        correlation = data["correlation_id"] or new_turn_id()
        word = content.split()[0].lower()
        if word == "/status":
            await self.send_status(session, thread, correlation, None)
            return
        try:
            answer = await self.kernel.run_command(thread, content)
        except ValueError as error:
            self.refuse(session, str(error), correlation)
            return
        if word == "/help":
            answer += WIRE_HELP
        session.emit("message", {"turn_id": None, "correlation_id": correlation,
                                 "content": answer, "notice": False, "tokens_used": 0})

    async def send_status(self, session: WireSession, thread: Thread,
                          correlation_id: str | None, turn_id: str | None) -> None:
        """A ``status`` event: `Kernel.view` of THREAD."""
        view = await self.kernel.view(thread)
        session.emit("status", {"thread": str(thread), "correlation_id": correlation_id,
                                "turn_id": turn_id, "view": view})

    # -- lifetime ---------------------------------------------------------------

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run COROUTINE as a task the service keeps (and cancels when it closes)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a wire task failed: %s", type(task.exception()).__name__)

    async def close(self, sessions: list[WireSession]) -> None:
        """Cancel every turn and task in flight and wait for them to end."""
        running = [t.task for s in sessions for t in s.turns.values() if t.task is not None]
        running += list(self.tasks)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=5.0)

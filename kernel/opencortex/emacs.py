"""The Emacs frontend: what Emacs may call, and how the kernel reaches Emacs.

- `EmacsLink`: the authenticated connections; a call goes to the one whose turn
  it is (the one that sent the message), else to the latest one.
- `EmacsActuator`: carries out `:target :emacs` actions through specific elisp
  methods (`opencortex-insert`, `opencortex-show-error`); text over the payload
  cap is split, never sent as one oversized frame.
- `StreamRelay`: streams the `:text` of a reply into the chat buffer while it
  arrives (`opencortex-stream`), ended or removed when the reply is complete.
- `EmacsApprover`: asks the person in the chat buffer (`opencortex-ask-approval`).
- `EmacsService`: the methods Emacs calls; each is a coroutine on the kernel's loop.
Nothing here evaluates elisp or Python sent by either side.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from opencortex.actions import Action, EmacsInsert
from opencortex.actuators import ActuatorError, MessageActuator, Outcome
from opencortex.approvals import ApprovalBook, ApprovalDecision, ApprovalRequest, Approver
from opencortex.epc import KernelConnection, current_connection
from opencortex.events import Event, EventError, Thread, chat_message
from opencortex.kernel import Kernel
from opencortex.turn import TurnObserver, TurnResult, new_turn_id
from opencortex.streaming import TextExtractor

log = logging.getLogger(__name__)

MAX_EMACS_ERROR = 200       # characters of an error Emacs signalled kept in its report


class EmacsLink:
    """The authenticated Emacs connections, oldest first (on the kernel's loop)."""

    def __init__(self, call_timeout: float = 10.0):
        self.connections: list[KernelConnection] = []
        self.call_timeout = call_timeout
        self.relays: dict[Thread, "StreamRelay"] = {}
        self.saying: set[Thread] = set()    # threads whose running turn is kept and said

    def connected(self, connection: KernelConnection) -> None:
        if connection not in self.connections:
            self.connections.append(connection)

    def disconnected(self, connection: KernelConnection) -> None:
        if connection in self.connections:
            self.connections.remove(connection)

    @property
    def connection(self) -> KernelConnection | None:
        """Where a call goes: the connection of the running method or turn (even when it
        has closed: its turn's words go nowhere else), else the latest live one."""
        own = current_connection.get()
        if own is not None:
            return own
        live = [c for c in self.connections if c.alive]
        return live[-1] if live else None

    async def call(self, method: str, *args: Any) -> Any:
        connection = self.connection
        if connection is None:
            raise ActuatorError("Emacs is not connected; run M-x opencortex-chat")
        if connection.closed:
            raise ActuatorError("the Emacs connection this message came from has closed")
        try:
            return await connection.call(method, list(args), self.call_timeout)
        except RuntimeError as error:          # Emacs signalled an error: its message
            why = " ".join(str(error).split())[:MAX_EMACS_ERROR]
            raise ActuatorError(f"Emacs did not take {method}: {why}") from error
        except (ConnectionError, OSError, asyncio.TimeoutError) as error:
            raise ActuatorError(f"Emacs did not take {method}: {type(error).__name__}") from error

    def notify(self, method: str, *args: Any) -> None:
        connection = self.connection
        if connection is not None and not connection.closed:
            try:
                connection.notify(method, list(args))
            except (ConnectionError, OSError, ValueError):
                log.info("Emacs is gone; %s not sent", method)


def split_utf8(text: str, max_bytes: int) -> list[str]:
    """TEXT in pieces of at most MAX_BYTES bytes of UTF-8, never splitting a character."""
    pieces, current, size = [], [], 0
    for char in text:
        width = len(char.encode("utf-8"))
        if size + width > max_bytes and current:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(char)
        size += width
    if current or not pieces:
        pieces.append("".join(current))
    return pieces


def as_lines(text: str) -> str:
    """TEXT ending with a newline, so what follows it in the buffer starts a line of its own."""
    return text if text.endswith("\n") else text + "\n"


class EmacsActuator(MessageActuator):
    targets = ("emacs",)

    def __init__(self, link: EmacsLink, max_payload_bytes: int,
                 chat_buffer: str = "*opencortex-chat*"):
        self.link = link
        self.chat_buffer = chat_buffer      # where a turn's reply streams
        # An escaped string can take twice its bytes; keep room for the frame around it.
        self.piece_bytes = max(1, max_payload_bytes // 2 - 4096)

    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        for piece in split_utf8(as_lines(text), self.piece_bytes):
            await self.link.call("opencortex-insert", address, piece)

    def saying(self, event: Event) -> None:
        self.link.saying.add(event.thread)

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        """A reply into the chat buffer takes the place of its streamed preview (one into
        another buffer goes there; the preview is dropped when the turn ends)."""
        relay = self.link.relays.get(event.thread)
        if (relay is None or not relay.streamed or relay.ended
                or not isinstance(action, EmacsInsert) or action.buffer != self.chat_buffer
                or event.channel != "emacs"):
            return await super().carry_out(action, event, key=key)
        first, *rest = split_utf8(as_lines(action.text), self.piece_bytes)
        await self.link.call("opencortex-stream", relay.turn_id, "end", first)
        relay.ended = True
        for piece in rest:
            await self.link.call("opencortex-insert", action.buffer, piece)
        return Outcome(shown=action.text)

    async def show_error(self, address: str, text: str) -> None:
        for piece in split_utf8(text, self.piece_bytes):
            await self.link.call("opencortex-show-error", piece)


class StreamRelay(TurnObserver):
    """Streams one turn's reply text into the chat buffer as it arrives.

    Kinds sent to Emacs: "chunk" (more text), "thinking" (more of a reasoning
    model's thinking), "reset" (a rejected reply's preview goes, or a request
    asked again thinks anew; the retry streams anew), "end" (the verified reply,
    or "" to drop the preview) and "abort" (the turn stopped; the text says
    why).  "end" or "abort" is always the last event of a turn."""

    def __init__(self, link: EmacsLink, thread: Thread, turn_id: str, piece_bytes: int):
        self.link = link
        self.thread = thread
        self.turn_id = turn_id
        self.piece_bytes = piece_bytes
        self.extractor = TextExtractor()
        self.streamed = False       # this reply's text or thinking was sent
        self.reply_done = False
        self.ended = False

    def on_chunk(self, text: str) -> None:
        if self.reply_done:
            self._next_reply()
        delta = self.extractor.feed(text)
        if delta:
            self._send("chunk", delta)

    def on_thinking(self, text: str, fresh: bool) -> None:
        if self.reply_done:
            self._next_reply()
        elif fresh:
            self._reset()
        self._send("thinking", text)

    def _next_reply(self) -> None:
        """The model is asked again (a rejected reply): what it streamed goes."""
        self.reply_done = False
        self.extractor = TextExtractor()
        self._reset()

    def _reset(self) -> None:
        if self.streamed:
            self.streamed = False
            self.link.notify("opencortex-stream", self.turn_id, "reset", "")

    def _send(self, kind: str, text: str) -> None:
        self.streamed = True
        # Turns of a thread run one at a time: the streaming one is the running one.
        self.link.relays[self.thread] = self
        for piece in split_utf8(text, self.piece_bytes):
            self.link.notify("opencortex-stream", self.turn_id, kind, piece)

    def on_reply_done(self) -> None:
        self.reply_done = True

    def finish(self) -> None:
        if not self.ended:
            self.ended = True
            self.link.notify("opencortex-stream", self.turn_id, "end", "")
        self._forget()

    def abort(self, message: str) -> None:
        self.ended = True
        self.link.notify("opencortex-stream", self.turn_id, "abort", message)
        self._forget()

    def _forget(self) -> None:
        if self.link.relays.get(self.thread) is self:
            del self.link.relays[self.thread]


class EmacsApprover(Approver):
    def __init__(self, link: EmacsLink, book: ApprovalBook):
        self.link = link
        self.book = book

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        shown = request.facts()  # kernel facts; the model's words only as :model-note
        self.book.open(request)
        try:
            await self.link.call("opencortex-ask-approval", request.id, shown)
        except ActuatorError:
            self.book.close(request.id)
            return ApprovalDecision("unavailable")
        return await self.book.wait(request)


class EmacsService:
    """The methods Emacs may call, by EPC name."""

    def __init__(self, kernel: Kernel, link: EmacsLink, book: ApprovalBook,
                 piece_bytes: int, max_waiting_turns: int = 64):
        """MAX_WAITING_TURNS: messages sent and not yet answered, at most, over every
        chat (a client sending faster than turns end gets an error, not a growing
        queue)."""
        self.kernel = kernel
        self.link = link
        self.book = book
        self.piece_bytes = piece_bytes
        self.max_waiting_turns = max_waiting_turns
        self.running: dict[Thread, list[asyncio.Task[TurnResult]]] = {}  # in arrival order

    def methods(self) -> dict[str, Any]:
        return {"send-message": self.send_message, "abort-turn": self.abort_turn,
                "slash-command": self.slash_command, "answer-approval": self.answer_approval,
                "status": self.status, "reload-skills": self.reload_skills,
                "branches": self.branches}

    async def send_message(self, chat_id: str, text: str) -> dict[str, Any]:
        """Acknowledge at once; the turn runs in the background and streams into Emacs."""
        try:
            event = chat_message(text, "emacs", chat_id)
        except EventError as error:
            raise ValueError(str(error)) from None
        waiting = sum(map(len, self.running.values()))
        if waiting >= self.max_waiting_turns:
            raise ValueError(f"{waiting} messages are waiting for their replies "
                             "already; send this one once some are answered")
        turn_id = new_turn_id()
        relay = StreamRelay(self.link, event.thread, turn_id, self.piece_bytes)
        task = asyncio.create_task(self.kernel.handle(event, relay, turn_id))
        self.running.setdefault(event.thread, []).append(task)
        task.add_done_callback(lambda done: self._turn_finished(event.thread, relay, done))
        return {"turn-id": turn_id, "thread": str(event.thread)}

    def _turn_finished(self, thread: Thread, relay: StreamRelay,
                       task: asyncio.Task[TurnResult]) -> None:
        self.link.saying.discard(thread)
        tasks = self.running.get(thread, [])
        if task in tasks:
            tasks.remove(task)
        if not tasks:
            self.running.pop(thread, None)
        if task.cancelled():
            relay.abort("Turn aborted: nothing of it was archived. Send the message again "
                        "when you are ready.")
        elif task.exception() is not None:
            log.error("turn failed unexpectedly: %s", type(task.exception()).__name__)
            relay.abort(f"Kernel error ({type(task.exception()).__name__}); the message "
                        "was not archived. See the kernel's stderr.")
        else:
            relay.finish()
        asyncio.ensure_future(self._status_changed(thread, relay.turn_id))

    async def _status_changed(self, thread: Thread, turn_id: str) -> None:
        self.link.notify("opencortex-status-changed",
                         {**await self.kernel.view(thread), "turn-id": turn_id})

    async def abort_turn(self, chat_id: str) -> bool:
        """Abort the turn in progress (turns of a thread run in arrival order); not one
        whose reply is decided and being written (it will be said and kept)."""
        thread = Thread("emacs", chat_id)
        pending = [t for t in self.running.get(thread, []) if not t.done()]
        if not pending or thread in self.link.saying:
            return False
        pending[0].cancel()
        return True

    async def answer_approval(self, approval_id: str, answer: str) -> bool:
        return self.book.answer(str(approval_id), str(answer).lower() in ("yes", "y", "t"))

    async def status(self, chat_id: str) -> dict[str, Any]:
        return await self.kernel.view(Thread("emacs", chat_id))

    async def reload_skills(self) -> dict[str, Any]:
        """Read the skills again, on a reading thread (as /reload): compiling them may
        take a while, and the loop serves every other chat meanwhile."""
        errors = await self.kernel.conversations.read(self.kernel.skills.reload)
        return {"skills": len(self.kernel.skills.skills), "errors": [str(e) for e in errors]}

    async def slash_command(self, chat_id: str, text: str) -> dict[str, Any]:
        """/status here (this client's status line); every other command, /reload
        included, through the kernel."""
        word = text.strip().split()[0].lower() if text.strip() else "/help"
        thread = Thread("emacs", chat_id)
        if word == "/status":
            view = await self.kernel.view(thread)
            return {"text": " ".join(f"{k}={v}" for k, v in view.items())}
        try:
            answer = await self.kernel.run_command(thread, text)
        except ValueError as error:
            answer = f"Error: {error}"
        if word == "/help":
            answer += "\n/status — this chat's status line"
        return {"text": answer}

    async def branches(self, chat_id: str) -> list[dict[str, Any]]:
        """The branches of this chat's thread, for `opencortex-switch-branch`: each a dict
        with "name", "head_turn", "turns" and "current"."""
        conversation = await self.kernel.conversations.open(Thread("emacs", chat_id))
        return conversation.log.branch_summaries()

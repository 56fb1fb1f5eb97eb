"""One Emacs connection to the kernel's EPC port, on the kernel's asyncio loop.

A connection is an `asyncio.Protocol`: no thread of its own.  Bytes go through a
`FrameBuffer`; each whole frame is decoded and handled in arrival order (a call
is handed to the server's `dispatch` at once, so calls start in the order they
were sent).  A frame over `INLINE_DECODE_BYTES` is decoded on a worker thread
while reading pauses, so a big paste never stalls other conversations and the
order still holds.

Any local process can connect, so until it authenticates a connection is held
to little: `authenticate` with the shared secret within `auth_timeout` seconds,
in at most `PRE_AUTH_FRAMES` frames of at most `PRE_AUTH_FRAME_BYTES` each, or
it is closed; a wrong secret is refused and the connection closed.

Sends never block: the transport buffers what the peer has not read yet, and
a peer that lets that pass `send_queue_bytes` has stopped reading, so it is
disconnected.  A closing connection has `FLUSH_ON_CLOSE` seconds to take its
last frames (a refusal, a last reply), then it is cut.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import re
import socket
import threading
from typing import TYPE_CHECKING, Any

from sexpdata import Symbol

from opencortex.epc_codec import decode_message, encode_message
from opencortex.epc_frames import FRAME_LIMIT, HEAD_BYTES, FrameBuffer, FrameError, Oversized

if TYPE_CHECKING:
    from opencortex.epc import KernelEpcServer

log = logging.getLogger("opencortex.epc")

HEAD = re.compile(rb"\(\s*call\s+(\d+)\s")
PRE_AUTH_FRAME_BYTES = 4096     # `authenticate` with a 64-hex-digit secret is ~100 bytes
PRE_AUTH_FRAMES = 4             # e.g. `methods`, then `authenticate`
FLUSH_ON_CLOSE = 2.0            # seconds a closing connection has to take its last frames
INLINE_DECODE_BYTES = 8 << 10   # bigger frames are decoded off the loop (~1 ms of sexpdata)
UNANSWERED_NOTICES = 4096       # notifications whose answer is still awaited, at most
QUICKACK = getattr(socket, "TCP_QUICKACK", None)   # Linux only


class PayloadTooLarge(ValueError):
    """A message would not fit the EPC frame or the configured cap."""


class ConnectionClosed(ConnectionError):
    """The connection is closed (or was closed for not reading): nothing more is sent."""


def quick_ack(transport: asyncio.BaseTransport | None) -> None:
    """Acknowledge what was just read at once (Linux): Emacs's socket keeps Nagle on, so
    its second small frame in a row (the return of our call, then the next message)
    waits for our ACK, which the kernel's TCP would delay ~40 ms when we have nothing to
    send.  TCP_QUICKACK does not stay set: it is set again at every read."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and QUICKACK is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        except OSError:
            pass


def method_name(value: Any) -> str:
    """The method name of an EPC call (a symbol, or a string from a lenient client)."""
    return value.value() if isinstance(value, Symbol) else str(value)


class KernelConnection(asyncio.Protocol):
    """One Emacs connection: authentication, ordered dispatch, non-blocking sends."""

    def __init__(self, server: KernelEpcServer):
        self.server = server
        self.loop = server.loop
        self.authenticated = False
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.frames = FrameBuffer(PRE_AUTH_FRAME_BYTES)
        self.frames_before_authentication = 0
        self.incoming: collections.deque[bytes | Oversized] = collections.deque()
        self.decoding = False                     # a big frame is being decoded off the loop
        self.waiting: dict[int, asyncio.Future[Any]] = {}   # calls into Emacs, by uid
        self.notices: dict[int, str] = {}         # notifications not yet answered, by uid
        self.uids = itertools.count(1)
        self.unsent: list[bytes] = []             # written in this pass of the loop
        self.unsent_bytes = 0
        self.admitted = False
        self._deadline: asyncio.TimerHandle | None = None

    @property
    def alive(self) -> bool:
        """Authenticated and still open."""
        return self.authenticated and not self.closed

    # --- the transport's side ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport                # type: ignore[assignment]
        # Small frames both ways: without this, Nagle and delayed ACKs add ~40 ms a call
        # (asyncio sets it only for sockets made with proto IPPROTO_TCP, not these).
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.admitted = self.server.admit(self)
        if not self.admitted:
            self.send_quietly("epc-error", [], f"the kernel has {self.server.max_connections} "
                              "connections open already (its limit): close one and connect "
                              "again")
            self.close()
            return
        self._deadline = self.loop.call_later(self.server.auth_timeout, self._too_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        self.incoming.clear()
        self._fail_waiting()
        if self.admitted:
            self.server.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        quick_ack(self.transport)
        self.frames.feed(data)
        broken = None
        try:
            while (frame := self.frames.next_frame()) is not None:
                self.incoming.append(frame)
        except FrameError as error:
            broken = str(error)
        self._handle_incoming()                   # the whole frames before a broken one
        if broken is not None:
            self._break(broken)

    def eof_received(self) -> bool:
        return False                              # the peer is done: close our side too

    # --- reading -----------------------------------------------------------------

    def _handle_incoming(self) -> None:
        """Handle the frames received, in order, until one must be decoded off the loop."""
        while self.incoming and not self.decoding and not self.closed:
            frame = self.incoming.popleft()
            if isinstance(frame, Oversized):
                self._refuse_oversized(frame)
            elif len(frame) > INLINE_DECODE_BYTES:
                self._decode_off_loop(frame)
            else:
                self._handle_frame(frame, decode(frame))

    def _decode_off_loop(self, frame: bytes) -> None:
        """Decode FRAME on a worker thread; reading and later frames wait for it."""
        self.decoding = True
        self.transport.pause_reading()
        future = self.loop.run_in_executor(None, decode, frame)
        future.add_done_callback(lambda done: self._decoded(frame, done))

    def _decoded(self, frame: bytes, done: asyncio.Future[Any]) -> None:
        self.decoding = False
        if self.closed:
            return
        self.transport.resume_reading()
        self._handle_frame(frame, done.result())
        self._handle_incoming()

    def _handle_frame(self, frame: bytes, message: tuple[str, Any, Any] | None) -> None:
        if not self.authenticated:
            self._before_authentication(message)
        elif message is None:
            self.send_quietly("epc-error", [], "malformed EPC message")
        else:
            self._after_authentication(*message)

    def _break(self, problem: str) -> None:
        """The peer broke the framing: say so, log it (throttled), close."""
        self.send_quietly("epc-error", [], f"{problem}: connection closed")
        self.server.log_framing(problem)
        self.close()

    def _too_late(self) -> None:
        if not self.authenticated and not self.closed:
            self.send_quietly("epc-error", [], "no authentication within "
                              f"{self.server.auth_timeout:g} seconds: connection closed")
            self.server.log_framing("it did not authenticate in time")
            self.close()

    def _refuse_oversized(self, frame: Oversized) -> None:
        head = HEAD.match(frame.start)
        self.send_quietly("return-error" if head else "epc-error",
                          int(head.group(1)) if head else [],
                          f"message of {frame.length} bytes refused: the cap is "
                          f"{self.server.max_payload_bytes} bytes")

    # --- before authentication ------------------------------------------------------

    def _before_authentication(self, message: tuple[str, Any, Any] | None) -> None:
        """Answer one message of an unauthenticated peer; close it when it is malformed,
        presents a wrong secret, or has sent too many."""
        if message is None:
            self.send_quietly("epc-error", [], "malformed EPC message: connection closed")
            self.close()
            return
        name, uid, args = message
        if name == "call" and len(args) == 2 and method_name(args[0]) == "authenticate":
            self._check_secret(uid, args[1])
            return
        if name == "methods":
            self.send_quietly("return", uid, [[Symbol("authenticate"), [], ""]])
        elif name == "call":
            self.send_quietly("return-error", uid,
                              "not authenticated: call authenticate with the secret first")
        self.frames_before_authentication += 1
        if self.frames_before_authentication >= PRE_AUTH_FRAMES:
            self.send_quietly("epc-error", [], "too many messages before authentication: "
                              "connection closed")
            self.close()

    def _check_secret(self, uid: Any, params: Any) -> None:
        given = params[0] if isinstance(params, list) and params else None
        if isinstance(given, str) and self.server.secret_matches(given):
            self.authenticated = True
            self._deadline.cancel()
            self.frames.cap, self.frames.strict = self.server.max_payload_bytes, False
            self.reply(uid, True)
            self.server.connection_authenticated(self)
            return
        self.server.log_wrong_secret()
        self.send_quietly("return-error", uid, "authentication failed: that is not the "
                          "kernel's secret; the connection is closed")
        self.close()

    # --- after authentication --------------------------------------------------------

    def _after_authentication(self, name: str, uid: Any, args: Any) -> None:
        if name == "call" and len(args) == 2:
            params = list(args[1]) if isinstance(args[1], list) else []
            self.server.dispatch(self, uid, method_name(args[0]), params)
        elif name == "methods":
            self.send_quietly("return", uid, [[Symbol(n), [], ""]
                                              for n in sorted(self.server.methods)])
        elif name in ("return", "return-error", "epc-error") and args:
            self._settle(uid, args[0], failed=name != "return")
        else:
            log.debug("an EPC message of an unknown kind was dropped")

    def _settle(self, uid: Any, value: Any, *, failed: bool) -> None:
        """An answer of Emacs to a call or a notification of the kernel's."""
        future = self.waiting.pop(uid, None) if isinstance(uid, int) else None
        if future is not None:
            if not future.done():
                if failed:
                    future.set_exception(RuntimeError(f"Emacs: {emacs_error(value)}"))
                else:
                    future.set_result(value)
            return
        method = self.notices.pop(uid, None) if isinstance(uid, int) else None
        if method is None:
            log.debug("an EPC answer to no call of the kernel's was dropped")
        elif failed:
            log.warning("Emacs method %s failed", method)

    # --- sending ------------------------------------------------------------------

    def send(self, *message: Any) -> None:
        """Queue one message; PayloadTooLarge over the cap, ConnectionClosed once closed
        (or when the peer has stopped reading).  From another thread, it is handed to
        the loop."""
        if self.closed:                        # before encoding: that costs the loop time
            raise ConnectionClosed("the Emacs connection is closed")
        data = encode_message(*message)
        if len(data) - HEAD_BYTES > min(FRAME_LIMIT, self.server.max_payload_bytes):
            raise PayloadTooLarge(f"an EPC message of {len(data)} bytes is over the cap of "
                                  f"{self.server.max_payload_bytes} bytes")
        if threading.get_ident() == self.server.loop_thread:
            self._write(data)
        else:
            self.loop.call_soon_threadsafe(self._write_quietly, data)

    def _write(self, data: bytes) -> None:
        """Queue DATA; what is queued in one pass of the loop goes out in one send."""
        if self.closed:
            raise ConnectionClosed("the Emacs connection is closed")
        queued = self.transport.get_write_buffer_size() + self.unsent_bytes + len(data)
        if queued > self.server.send_queue_bytes:
            self._stopped_reading()
            raise ConnectionClosed("the Emacs connection stopped reading its replies; "
                                   "it was closed")
        if not self.unsent:
            self.loop.call_soon(self._flush)
        self.unsent.append(data)
        self.unsent_bytes += len(data)

    def _flush(self) -> None:
        """Hand what was queued to the transport (which sends what the socket takes)."""
        unsent, self.unsent, self.unsent_bytes = self.unsent, [], 0
        if unsent and not self.transport.is_closing():
            self.transport.write(b"".join(unsent))

    def _write_quietly(self, data: bytes) -> None:
        try:
            self._write(data)
        except ConnectionError:
            pass

    def send_quietly(self, *message: Any) -> None:
        """Send, ignoring a closed connection (for refusals: the peer may be gone)."""
        try:
            self.send(*message)
        except ConnectionError:
            pass

    def _stopped_reading(self) -> None:
        self.closed = True
        self.unsent, self.unsent_bytes = [], 0
        self.transport.abort()
        log.warning("an Emacs connection stopped reading what the kernel sends; it was "
                    "disconnected")

    def reply(self, uid: Any, value: Any) -> None:
        try:
            self.send("return", uid, value)
        except PayloadTooLarge as error:
            self.send("return-error", uid, str(error))

    def refuse(self, uid: Any, message: str) -> None:
        self.send("return-error", uid, message)

    async def call(self, method: str, args: list[Any], timeout: float) -> Any:
        """Call METHOD in Emacs; its return value, or an exception."""
        if self.closed:
            raise ConnectionClosed("the Emacs connection is closed")
        uid = next(self.uids)
        future: asyncio.Future[Any] = self.loop.create_future()
        self.waiting[uid] = future
        try:
            self.send("call", uid, Symbol(method), args)
            async with asyncio.timeout(timeout):        # no task of its own (wait_for)
                return await future
        finally:
            self.waiting.pop(uid, None)

    def notify(self, method: str, args: list[Any]) -> None:
        """Call METHOD in Emacs without waiting; a failure is logged (never its content)."""
        uid = next(self.uids)
        self.send("call", uid, Symbol(method), args)
        self.notices[uid] = method
        if len(self.notices) > UNANSWERED_NOTICES:        # an Emacs that never answers
            del self.notices[next(iter(self.notices))]

    def _fail_waiting(self) -> None:
        """The connection closed: calls still waiting for Emacs fail now, not at their
        timeout (a turn must not hang on an Emacs that is gone)."""
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionClosed("the Emacs connection closed"))
        self.waiting.clear()
        self.notices.clear()

    def close(self) -> None:
        """Stop reading; send what is queued within FLUSH_ON_CLOSE seconds, then cut."""
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()
            self.loop.call_later(FLUSH_ON_CLOSE, self.transport.abort)


def decode(frame: bytes) -> tuple[str, Any, Any] | None:
    """FRAME as (name, uid, args), or None when it is not an EPC message."""
    try:
        name, uid, args = decode_message(frame)
    except Exception:               # sexpdata raises many kinds (see KNOWLEDGE.md)
        return None
    return str(name), uid, args


def emacs_error(value: Any) -> str:
    """An error Emacs returned, as Emacs would word it: `(error "Buffer x is read-only")`
    as its message, `(wrong-type-argument stringp 5)` as "wrong-type-argument: stringp, 5"."""
    if isinstance(value, list) and value and isinstance(value[0], Symbol):
        name, data = str(value[0]), [str(item) for item in value[1:]]
        if name in ("error", "user-error") and data:
            return " ".join(data)
        return f"{name}: {', '.join(data)}" if data else name
    return str(value)

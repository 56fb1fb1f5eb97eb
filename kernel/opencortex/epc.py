"""The EPC server Emacs talks to, bound to 127.0.0.1 only.

Each connection has a reader thread and a writer thread.  The reader hands each
call, in arrival order, to the kernel's asyncio loop, where `methods` (a fixed
table of coroutines) run; python-epc's own one-thread-per-message handling would
lose the order.  Everything sent to a connection goes through its `Outbox`: the
loop never blocks on a peer that does not read, and such a peer is disconnected.

Any local process can connect, so a connection is held to little until it
authenticates: it must send `authenticate` with the shared secret within
`auth_timeout` seconds, in at most a few frames of at most 4 KiB each, or it is
closed; a wrong secret is refused and the connection closed.  Frame lengths are
checked before anything is read (see `epc_frames`), at most `max_connections`
connections are open at once, and refusals are logged at most once a minute.

Each method runs with `current_connection` set to the connection that called
it; tasks it starts (a turn) inherit it, so a turn's replies, streams and
approval questions go back to the Emacs that sent its message.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import re
import socket
import threading
import time
from typing import Any, Awaitable, Callable

from epc.handler import EPCHandler, encode_message, unpack_message
from epc.server import EPCServer
from sexpdata import Symbol

from opencortex.epc_frames import (FRAME_LIMIT, HEAD_BYTES, FrameError, FrameTimeout, Oversized,
                                   read_frame, read_frame_before)
from opencortex.epc_outbox import Outbox, OutboxClosed
from opencortex.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

Method = Callable[..., Awaitable[Any]]
HEAD = re.compile(rb"\(\s*call\s+(\d+)\s")
PRE_AUTH_FRAME_BYTES = 4096     # `authenticate` with a 64-hex-digit secret is ~100 bytes
PRE_AUTH_FRAMES = 4             # e.g. `methods`, then `authenticate`
FLUSH_ON_CLOSE = 2.0            # seconds a closing connection has to take its last frames
SEND_QUEUE_PAYLOADS = 4         # default outbox bound, in max-size messages

# python-epc logs whole messages (debug) and replies it cannot match (error): never shown.
PROTOCOL_LOG = logging.getLogger("opencortex.epc.protocol")
PROTOCOL_LOG.setLevel(logging.CRITICAL)
PROTOCOL_LOG.propagate = False

current_connection: contextvars.ContextVar["KernelConnection | None"] = \
    contextvars.ContextVar("opencortex_epc_connection", default=None)


class PayloadTooLarge(ValueError):
    """A message would not fit the EPC frame or the configured cap."""


class KernelConnection(EPCHandler):
    """One Emacs connection: authentication, ordered dispatch, non-blocking sends."""

    server: "KernelEpcServer"

    def setup(self) -> None:
        self.authenticated = False
        self.closed = False
        self.waiting: set[asyncio.Future[Any]] = set()   # calls into Emacs not yet answered
        # Small frames both ways: without this, Nagle and delayed ACKs add ~40 ms a call.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()
        self.outbox = Outbox(self.request, self.server.send_queue_bytes,
                             on_overflow=self._stopped_reading, name="opencortex-epc-writer")

    @property
    def alive(self) -> bool:
        """Authenticated and still open."""
        return self.authenticated and not self.closed

    def handle(self) -> None:
        """Authenticate, then read frames until the peer closes or breaks the framing."""
        try:
            if self._authenticate():
                self.request.settimeout(None)
                self._serve_authenticated()
        except FrameTimeout:
            self._send_quietly("epc-error", [], "no authentication within "
                               f"{self.server.auth_timeout:g} seconds: connection closed")
            self.server.log_framing("it did not authenticate in time")
        except FrameError as error:
            self._send_quietly("epc-error", [], f"{error}: connection closed")
            self.server.log_framing(str(error))
        except OSError:
            pass                                   # reset by the peer, or shut down by us

    def finish(self) -> None:
        self.closed = True
        self._fail_waiting()
        self.outbox.close(flush_timeout=FLUSH_ON_CLOSE)
        try:
            super().finish()
        finally:
            self.server.connection_closed(self)

    def _authenticate(self) -> bool:
        """Before authentication: a few small frames, one deadline.  Whether it succeeded."""
        deadline = time.monotonic() + self.server.auth_timeout
        for _ in range(PRE_AUTH_FRAMES):
            frame = read_frame_before(self.request, PRE_AUTH_FRAME_BYTES, deadline)
            if frame is None:
                return False
            verdict = self._before_authentication(frame)
            if verdict is not None:
                return verdict
        self._send_quietly("epc-error", [], "too many messages before authentication: "
                           "connection closed")
        return False

    def _before_authentication(self, frame: bytes) -> bool | None:
        """Answer one frame from an unauthenticated peer: True/False when authentication
        succeeded/failed (or the frame was malformed), None to read another."""
        try:
            name, uid, args = unpack_message(frame)
        except Exception:
            self._send_quietly("epc-error", [], "malformed EPC message: connection closed")
            return False
        if name == "call" and len(args) == 2 and method_name(args[0]) == "authenticate":
            return self._check_secret(uid, args[1])
        if name == "methods":
            self._send_quietly("return", uid, [[Symbol("authenticate"), [], ""]])
        elif name == "call":
            self._send_quietly("return-error", uid,
                               "not authenticated: call authenticate with the secret first")
        return None                 # replies: the kernel has called nothing here; ignored

    def _check_secret(self, uid: Any, params: Any) -> bool:
        given = params[0] if isinstance(params, list) and params else None
        if isinstance(given, str) and self.server.secret_matches(given):
            self.authenticated = True
            self.reply(uid, True)
            self.server.connection_authenticated(self)
            return True
        self.server.log_wrong_secret()
        self._send_quietly("return-error", uid, "authentication failed: that is not the "
                           "kernel's secret; the connection is closed")
        return False

    def _serve_authenticated(self) -> None:
        """Frames up to the payload cap are handled; bigger ones are drained and refused."""
        while (frame := read_frame(self.rfile, self.server.max_payload_bytes)) is not None:
            if isinstance(frame, Oversized):
                self._refuse_oversized(frame)
            else:
                self._handle(frame)

    def _refuse_oversized(self, frame: Oversized) -> None:
        head = HEAD.match(frame.start)
        self._send_quietly("return-error" if head else "epc-error",
                           int(head.group(1)) if head else [],
                           f"message of {frame.length} bytes refused: the cap is "
                           f"{self.server.max_payload_bytes} bytes")

    def _handle(self, sexp: bytes) -> None:
        """Runs on this connection's reader thread, message by message, in arrival order."""
        try:
            name, uid, args = unpack_message(sexp)
        except Exception:
            self._send_quietly("epc-error", [], "malformed EPC message")
            return
        if name == "call" and len(args) == 2:
            params = list(args[1]) if isinstance(args[1], list) else []
            self.server.loop.call_soon_threadsafe(self.server.dispatch, self, uid,
                                                  method_name(args[0]), params)
        elif name == "methods":
            self._send_quietly("return", uid, [[Symbol(n), [], ""]
                                               for n in sorted(self.server.methods)])
        else:  # replies to calls the kernel made into Emacs
            super()._handle(sexp)

    def handle_error(self, err: Exception) -> bool:
        """A reply python-epc could not match: dropped, never echoed, logged without content."""
        log.debug("an EPC reply was dropped: %s", type(err).__name__)
        return True

    def _send(self, *args: Any) -> None:
        """Queue one message; PayloadTooLarge over the cap, ConnectionError once closed."""
        if self.closed:                        # before encoding: that costs the loop time
            raise OutboxClosed("the Emacs connection is closed")
        data = encode_message(*args)
        if len(data) - HEAD_BYTES > min(FRAME_LIMIT, self.server.max_payload_bytes):
            raise PayloadTooLarge(f"an EPC message of {len(data)} bytes is over the cap of "
                                  f"{self.server.max_payload_bytes} bytes")
        self.outbox.put(data)

    def _send_quietly(self, *args: Any) -> None:
        """Send, ignoring a closed connection (for refusals: the peer may be gone)."""
        try:
            self._send(*args)
        except ConnectionError:
            pass

    def _stopped_reading(self) -> None:
        self.closed = True
        log.warning("an Emacs connection stopped reading what the kernel sends; it was "
                    "disconnected")

    def reply(self, uid: Any, value: Any) -> None:
        try:
            self._send("return", uid, value)
        except PayloadTooLarge as error:
            self._send("return-error", uid, str(error))

    def refuse(self, uid: Any, message: str) -> None:
        self._send("return-error", uid, message)

    async def call(self, method: str, args: list[Any], timeout: float) -> Any:
        """Call METHOD in Emacs; its return value, or an exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, failed: bool) -> None:
            if not future.done():
                (future.set_exception if failed else future.set_result)(
                    RuntimeError(f"Emacs: {value}") if failed else value)

        if self.closed:
            raise ConnectionError("the Emacs connection is closed")
        self.waiting.add(future)
        try:
            EPCHandler.call(self, method, args,
                            callback=lambda v: loop.call_soon_threadsafe(settle, v, False),
                            errback=lambda e: loop.call_soon_threadsafe(settle, e, True))
            return await asyncio.wait_for(future, timeout)
        finally:
            self.waiting.discard(future)

    def _fail_waiting(self) -> None:
        """The connection closed: calls still waiting for Emacs fail now, not at their
        timeout (a turn must not hang on an Emacs that is gone)."""
        def fail(future: asyncio.Future[Any]) -> None:
            if not future.done():
                future.set_exception(ConnectionError("the Emacs connection closed"))
        for future in list(self.waiting):
            future.get_loop().call_soon_threadsafe(fail, future)

    def notify(self, method: str, args: list[Any]) -> None:
        """Call METHOD in Emacs without waiting; a failure is logged (never its content)."""
        EPCHandler.call(self, method, args, callback=lambda _: None,
                        errback=lambda e: log.warning("Emacs method %s failed", method))


def method_name(value: Any) -> str:
    """The method name of an EPC call (a symbol, or a string from a lenient client)."""
    return value.value() if isinstance(value, Symbol) else str(value)


class KernelEpcServer(EPCServer):
    """Serves METHODS to authenticated connections on 127.0.0.1."""

    allow_reuse_address = True
    daemon_threads = True
    logger = PROTOCOL_LOG

    def __init__(self, loop: asyncio.AbstractEventLoop, secret: str,
                 methods: dict[str, Method], *, port: int = 0,
                 max_payload_bytes: int = 4 << 20, max_connections: int = 16,
                 auth_timeout: float = 5.0, send_queue_bytes: int | None = None,
                 on_connect: Callable[[KernelConnection], None] | None = None,
                 on_disconnect: Callable[[KernelConnection], None] | None = None,
                 listening: socket.socket | None = None):
        self.loop = loop
        self.secret = secret
        self.methods = methods
        self.max_payload_bytes = max_payload_bytes
        self.max_connections = max_connections
        self.auth_timeout = auth_timeout
        self.send_queue_bytes = send_queue_bytes or SEND_QUEUE_PAYLOADS * max_payload_bytes
        if self.send_queue_bytes < max_payload_bytes + HEAD_BYTES:
            raise ValueError("send_queue_bytes must hold at least one message of "
                             "max_payload_bytes")
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.open_connections = 0
        self._slots = threading.Lock()
        self.log_wrong_secret = ThrottledLog("an EPC connection presented a wrong secret "
                                             "and was closed")
        self.log_refused = ThrottledLog("an EPC connection was refused: too many open")
        self.log_framing = ThrottledLog("an EPC connection was closed: ", level=logging.INFO)
        if listening is None:
            super().__init__(("127.0.0.1", port), RequestHandlerClass=KernelConnection)
        else:               # bound and listening already (`opencortex serve` binds early)
            super().__init__(listening.getsockname(), RequestHandlerClass=KernelConnection,
                             bind_and_activate=False)
            self.socket.close()
            self.socket = listening
            self.server_address = listening.getsockname()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def secret_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.secret.encode())

    def process_request(self, request: Any, client_address: Any) -> None:
        """One reader thread per connection, up to `max_connections`; others refused."""
        with self._slots:
            admitted = self.open_connections < self.max_connections
            if admitted:
                self.open_connections += 1
        if not admitted:
            self._refuse_connection(request)
            return
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address),
                                  daemon=True, name="opencortex-epc-connection")
        thread.start()

    def _refuse_connection(self, request: socket.socket) -> None:
        """Say why without waiting for the peer, then close."""
        self.log_refused()
        try:
            request.setblocking(False)
            request.send(encode_message(
                "epc-error", [], f"the kernel has {self.max_connections} connections open "
                "already (its limit): close one and connect again"))
        except OSError:
            pass
        self.shutdown_request(request)

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as error:
            log.info("an EPC connection ended with an error: %s", type(error).__name__)
        finally:
            self.shutdown_request(request)
            with self._slots:
                self.open_connections -= 1

    def connection_authenticated(self, connection: KernelConnection) -> None:
        """From the reader thread: tell `on_connect` on the loop, before any later call."""
        if self.on_connect:
            self._on_loop(self.on_connect, connection)

    def connection_closed(self, connection: KernelConnection) -> None:
        if connection.authenticated and self.on_disconnect:
            self._on_loop(self.on_disconnect, connection)

    def _on_loop(self, function: Callable[[KernelConnection], None],
                 connection: KernelConnection) -> None:
        try:
            self.loop.call_soon_threadsafe(function, connection)
        except RuntimeError:
            pass                                   # the loop is closed: the kernel is stopping

    def dispatch(self, connection: KernelConnection, uid: Any, method: str,
                 params: list[Any]) -> None:
        """On the kernel's loop: run one method of an authenticated connection as a task."""
        try:
            self._dispatch(connection, uid, method, params)
        except ConnectionError:
            log.info("could not answer %s: the connection is closed", method)

    def _dispatch(self, connection: KernelConnection, uid: Any, method: str,
                  params: list[Any]) -> None:
        if method == "authenticate":
            given = params[0] if params and isinstance(params[0], str) else ""
            if self.secret_matches(given):
                connection.reply(uid, True)
            else:
                connection.refuse(uid, "authentication failed")
            return
        function = self.methods.get(method)
        if function is None:
            connection.refuse(uid, f"no such method: {method}")
            return
        try:
            call = function(*params)
        except TypeError:
            connection.refuse(uid, f"{method}: wrong number of arguments ({len(params)})")
            return
        context = contextvars.copy_context()
        context.run(current_connection.set, connection)
        task = self.loop.create_task(call, context=context)
        task.add_done_callback(lambda done: self._answer(connection, uid, method, done))

    def _answer(self, connection: KernelConnection, uid: Any, method: str,
                task: asyncio.Task) -> None:
        try:
            if task.cancelled():
                connection.refuse(uid, f"{method} was cancelled")
            elif task.exception() is not None:
                error = task.exception()
                log.warning("EPC method %s failed: %s", method, type(error).__name__)
                connection.refuse(uid, f"{method} failed: {error}")
            else:
                connection.reply(uid, task.result())
        except ConnectionError:
            log.info("could not answer %s: the connection is closed", method)

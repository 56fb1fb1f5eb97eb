"""The EPC server Emacs talks to, bound to 127.0.0.1 only, on the kernel's loop.

No thread per connection: each connection is an asyncio protocol
(`epc_connection.KernelConnection`), and each call runs as a task on the loop,
started in arrival order, where `methods` (a fixed table of coroutines) run.
What a hostile local client is held to (authentication first, frame caps, a
deadline, a send queue bound) is in `epc_connection`; here: at most
`max_connections` connections are open at once, and refusals are logged at most
once a minute.

Each method runs with `current_connection` set to the connection that called
it; tasks it starts (a turn) inherit it, so a turn's replies, streams and
approval questions go back to the Emacs that sent its message.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import socket
import threading
from typing import Any, Awaitable, Callable

from opencortex.epc_connection import (ConnectionClosed, KernelConnection, PayloadTooLarge,
                                       method_name)
from opencortex.epc_frames import HEAD_BYTES
from opencortex.throttled_log import ThrottledLog

__all__ = ["ConnectionClosed", "KernelConnection", "KernelEpcServer", "PayloadTooLarge",
           "current_connection", "method_name"]

log = logging.getLogger(__name__)

Method = Callable[..., Awaitable[Any]]
SEND_QUEUE_PAYLOADS = 4         # default send bound, in max-size messages

current_connection: contextvars.ContextVar[KernelConnection | None] = \
    contextvars.ContextVar("opencortex_epc_connection", default=None)


class KernelEpcServer:
    """Serves METHODS to authenticated connections on 127.0.0.1, from `start` to `close`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, secret: str,
                 methods: dict[str, Method], *, port: int = 0,
                 max_payload_bytes: int = 4 << 20, max_connections: int = 16,
                 auth_timeout: float = 5.0, send_queue_bytes: int | None = None,
                 on_connect: Callable[[KernelConnection], None] | None = None,
                 on_disconnect: Callable[[KernelConnection], None] | None = None,
                 listening: socket.socket | None = None):
        self.loop = loop
        self.loop_thread: int | None = None       # set by `start`, on the loop
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
        self.clients: list[KernelConnection] = []          # admitted, open
        self.log_wrong_secret = ThrottledLog("an EPC connection presented a wrong secret "
                                             "and was closed")
        self.log_refused = ThrottledLog("an EPC connection was refused: too many open")
        self.log_framing = ThrottledLog("an EPC connection was closed: ", level=logging.INFO)
        # Bound and listening now (`opencortex serve` binds early), served from `start`.
        self.listening = listening or socket.create_server(("127.0.0.1", port))
        self._server: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        return self.listening.getsockname()[1]

    @property
    def open_connections(self) -> int:
        return len(self.clients)

    async def start(self) -> None:
        """Accept connections (on the running loop, which must be `loop`)."""
        self.loop_thread = threading.get_ident()
        self._server = await self.loop.create_server(lambda: KernelConnection(self),
                                                     sock=self.listening)

    async def close(self) -> None:
        """Stop accepting and close every connection (their last frames get a moment)."""
        if self._server is not None:
            self._server.close()
        else:
            self.listening.close()
        for connection in list(self.clients):
            connection.close()
        await asyncio.sleep(0)

    def secret_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.secret.encode())

    def admit(self, connection: KernelConnection) -> bool:
        """Whether CONNECTION gets a slot (`max_connections` at most); logs a refusal."""
        if len(self.clients) >= self.max_connections:
            self.log_refused()
            return False
        self.clients.append(connection)
        return True

    def connection_authenticated(self, connection: KernelConnection) -> None:
        """Tell `on_connect`, before any later call of CONNECTION is dispatched."""
        if self.on_connect:
            self.on_connect(connection)

    def connection_closed(self, connection: KernelConnection) -> None:
        self.clients.remove(connection)
        if connection.authenticated and self.on_disconnect:
            self.on_disconnect(connection)

    def dispatch(self, connection: KernelConnection, uid: Any, method: str,
                 params: list[Any]) -> None:
        """Run one method of an authenticated connection as a task."""
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

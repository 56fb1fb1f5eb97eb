"""The EPC server Emacs talks to, bound to 127.0.0.1 only.

python-epc reads each connection on its own thread.  Its threading handler
would run every message on a new thread, losing arrival order; here the
connection's reader thread hands each call, in arrival order, to the kernel's
asyncio loop instead, where `methods` (a fixed table of coroutines) run.

A connection must call `authenticate` with the shared secret first; until it
does, every other call is refused and nothing else happens.  Messages larger
than the payload cap are refused in both directions (EPC frames carry a 6-hex-
digit length: past 16 MiB the stream would be corrupted).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import socket
import threading
from typing import Any, Awaitable, Callable

from epc.handler import EPCHandler, encode_message, unpack_message
from epc.server import EPCServer
from sexpdata import Symbol

log = logging.getLogger(__name__)

Method = Callable[..., Awaitable[Any]]
FRAME_LIMIT = 0xFFFFFF
HEAD = re.compile(rb"\(\s*call\s+(\d+)\s")


class PayloadTooLarge(ValueError):
    """A message would not fit the EPC frame or the configured cap."""


class KernelConnection(EPCHandler):
    """One Emacs connection: authentication state, ordered dispatch, safe writes."""

    server: "KernelEpcServer"

    def setup(self) -> None:
        self.authenticated = False
        self.write_lock = threading.Lock()
        # Small frames both ways: without this, Nagle and delayed ACKs add ~40 ms a call.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def _send(self, *args: Any) -> None:
        data = encode_message(*args)
        if len(data) - 6 > min(FRAME_LIMIT, self.server.max_payload_bytes):
            raise PayloadTooLarge(f"an EPC message of {len(data)} bytes is over the cap of "
                                  f"{self.server.max_payload_bytes} bytes")
        with self.write_lock:
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except (AttributeError, ValueError, OSError) as error:
                raise ConnectionError("the Emacs connection is closed") from error

    def _handle(self, sexp: bytes) -> None:
        """Runs on this connection's reader thread, message by message, in arrival order."""
        if len(sexp) > self.server.max_payload_bytes:
            head = HEAD.match(sexp[:64])
            uid = int(head.group(1)) if head else []
            self._send("return-error" if head else "epc-error", uid,
                       f"message of {len(sexp)} bytes refused: the cap is "
                       f"{self.server.max_payload_bytes} bytes")
            return
        try:
            name, uid, args = unpack_message(sexp)
        except Exception:
            self._send("epc-error", [], "malformed EPC message")
            return
        if name == "call" and len(args) == 2:
            method = args[0].value() if isinstance(args[0], Symbol) else str(args[0])
            params = list(args[1]) if isinstance(args[1], list) else []
            self.server.loop.call_soon_threadsafe(self.server.dispatch, self, uid, method, params)
        elif name == "methods":
            names = sorted(self.server.methods) if self.authenticated else ["authenticate"]
            self._send("return", uid, [[Symbol(n), [], ""] for n in names])
        else:  # replies to calls the kernel made into Emacs
            super()._handle(sexp)

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

        EPCHandler.call(self, method, args,
                        callback=lambda v: loop.call_soon_threadsafe(settle, v, False),
                        errback=lambda e: loop.call_soon_threadsafe(settle, e, True))
        return await asyncio.wait_for(future, timeout)

    def notify(self, method: str, args: list[Any]) -> None:
        """Call METHOD in Emacs without waiting; a failure is logged (never its content)."""
        EPCHandler.call(self, method, args, callback=lambda _: None,
                        errback=lambda e: log.warning("Emacs method %s failed", method))


class KernelEpcServer(EPCServer):
    """Serves METHODS to authenticated connections on 127.0.0.1."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, loop: asyncio.AbstractEventLoop, secret: str,
                 methods: dict[str, Method], *, port: int = 0,
                 max_payload_bytes: int = 4 << 20,
                 on_connect: Callable[[KernelConnection], None] | None = None):
        self.loop = loop
        self.secret = secret
        self.methods = methods
        self.max_payload_bytes = max_payload_bytes
        self.on_connect = on_connect
        super().__init__(("127.0.0.1", port), RequestHandlerClass=KernelConnection)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection (the ordering within it is kept by `dispatch`)."""
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address),
                                  daemon=True, name="opencortex-epc-connection")
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            log.info("an EPC connection ended with an error")
        finally:
            self.shutdown_request(request)

    def dispatch(self, connection: KernelConnection, uid: Any, method: str,
                 params: list[Any]) -> None:
        """On the kernel's loop: authenticate, or run one method as a task."""
        if method == "authenticate":
            given = params[0] if params and isinstance(params[0], str) else ""
            if hmac.compare_digest(given.encode(), self.secret.encode()):
                connection.authenticated = True
                connection.reply(uid, True)
                if self.on_connect:
                    self.on_connect(connection)
            else:
                log.warning("an EPC connection presented a wrong secret")
                connection.refuse(uid, "authentication failed")
            return
        if not connection.authenticated:
            connection.refuse(uid, "not authenticated: call authenticate with the secret first")
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
        task = self.loop.create_task(call)
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

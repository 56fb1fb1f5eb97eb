"""signal-cli's JSON-RPC interface, client side: one connection to its daemon.

signal-cli's daemon (`signal-cli -a NUMBER daemon --socket PATH` or
`--tcp HOST:PORT`, see signal-cli-jsonrpc(5)) speaks JSON-RPC 2.0, one JSON
object per line in both directions.  A request carries an `id` and gets one
response with that id, holding a `result` or an `error` object (`code`,
`message`, `data`); signal-cli answers requests concurrently, so responses may
come out of order.  Incoming messages arrive as `receive` notifications (no
id) at any time, also between a request and its response.

This module is the transport only: it matches responses to requests, keeps
notifications until they are collected, and reports a lost connection.  What
the calls mean is `opencortex.bridges.signal`'s business.  Requests are written
as ASCII JSON (everything else \\u-escaped), so no text can fail to encode.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from typing import Any

log = logging.getLogger(__name__)

LINE_LIMIT = 16 << 20          # bytes of one incoming line (a long message, a big group list)
DEFAULT_SOCKET = "signal-cli/socket"   # under $XDG_RUNTIME_DIR: signal-cli's --socket default


class ConnectionLost(Exception):
    """The daemon could not be reached, or the connection ended; the text says why."""


class RpcError(Exception):
    """signal-cli answered a request with a JSON-RPC error object."""

    def __init__(self, method: str, code: int, message: str, data: Any = None):
        super().__init__(f"{method}: {message} (JSON-RPC error {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


def parse_address(address: str) -> tuple[str, Any]:
    """("unix", PATH) or ("tcp", (HOST, PORT)) for ADDRESS; ValueError if it is neither.

    "" is signal-cli's default socket, $XDG_RUNTIME_DIR/signal-cli/socket; "unix:PATH"
    or anything with a "/" is a socket path; "HOST:PORT" ("[::1]:PORT") is TCP."""
    if not address:
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if not runtime:
            raise ValueError("no address given and $XDG_RUNTIME_DIR is not set; set "
                             "[bridges.signal] address to the daemon's socket or HOST:PORT")
        return "unix", os.path.join(runtime, DEFAULT_SOCKET)
    if address.startswith("unix:"):
        return "unix", os.path.expanduser(address[len("unix:"):])
    if "/" in address or address.startswith("~"):
        return "unix", os.path.expanduser(address)
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"signal-cli address {address!r} is neither a socket path nor "
                         "HOST:PORT")
    return "tcp", (host.strip("[]"), int(port))


class RpcConnection:
    """One open connection to signal-cli's JSON-RPC daemon."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 where: str):
        self.where = where
        self.reason = ""                      # why the connection ended, once it has
        self._reader = reader
        self._writer = writer
        self._next_id = 0
        self._waiting: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._notes: deque[dict[str, Any]] = deque()
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read(), name=f"signal-cli {where}")

    @classmethod
    async def open(cls, address: str, timeout: float) -> "RpcConnection":
        """Connect to the daemon at ADDRESS (see `parse_address`) within TIMEOUT seconds."""
        try:
            kind, target = parse_address(address)
        except ValueError as error:
            raise ConnectionLost(str(error)) from None
        where = target if kind == "unix" else f"{target[0]}:{target[1]}"
        try:
            if kind == "unix":
                opening = asyncio.open_unix_connection(target, limit=LINE_LIMIT)
            else:
                opening = asyncio.open_connection(*target, limit=LINE_LIMIT)
            reader, writer = await asyncio.wait_for(opening, timeout)
        except (OSError, TimeoutError) as error:
            raise ConnectionLost(f"cannot connect to {where} ({_why(error)})") from None
        return cls(reader, writer, where)

    @property
    def closed(self) -> bool:
        return bool(self.reason)

    async def call(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        """METHOD's result; RpcError for an error object, ConnectionLost, TimeoutError."""
        if self.closed:
            raise ConnectionLost(self.reason)
        self._next_id += 1
        ident = self._next_id
        request: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": ident}
        if params:
            request["params"] = params
        future = asyncio.get_running_loop().create_future()
        self._waiting[ident] = method, future
        try:
            self._writer.write(json.dumps(request).encode("ascii") + b"\n")
            await self._writer.drain()
            return await asyncio.wait_for(future, timeout)
        except OSError as error:
            self._lost(f"writing failed ({_why(error)})")
            raise ConnectionLost(self.reason) from None
        finally:
            self._waiting.pop(ident, None)

    async def notifications(self, timeout: float) -> list[dict[str, Any]]:
        """The notifications received so far, waiting up to TIMEOUT seconds for the first.

        Raises ConnectionLost once the connection has ended and nothing is left."""
        if not self._notes and not self.closed:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except TimeoutError:
                pass
        if self._notes:
            notes = list(self._notes)
            self._notes.clear()
            return notes
        if self.closed:
            raise ConnectionLost(self.reason)
        return []

    async def close(self) -> None:
        """End the connection (signal-cli then ends this connection's subscriptions)."""
        self._lost("closed by the bridge")
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    # -- reading ----------------------------------------------------------------

    async def _read(self) -> None:
        reason = "signal-cli closed the connection"
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                self._take(line)
        except ValueError:                   # a line over LINE_LIMIT
            reason = f"signal-cli sent a line over {LINE_LIMIT} bytes"
        except OSError as error:
            reason = f"the connection failed ({_why(error)})"
        finally:
            self._lost(reason)

    def _take(self, line: bytes) -> None:
        """One line from the daemon: a response to a request, or a notification."""
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            log.warning("signal-cli sent a line that is not JSON; ignored")
            return
        if not isinstance(message, dict):
            log.warning("signal-cli sent a JSON line that is not an object; ignored")
        elif "method" in message and "id" not in message:
            self._notes.append(message)
            self._arrived.set()
        elif "result" in message or "error" in message:
            self._answer(message)

    def _answer(self, message: dict[str, Any]) -> None:
        ident = message.get("id")
        method, future = self._waiting.get(ident, ("", None)) if isinstance(ident, int) \
            else ("", None)
        error = message.get("error")
        if future is None or future.done():
            code = error.get("code") if isinstance(error, dict) else None
            log.info("signal-cli sent an answer to no open request (error code %s)", code)
            return
        if error is None:
            future.set_result(message.get("result"))
            return
        if not isinstance(error, dict):
            error = {"code": 0, "message": "malformed error object"}
        future.set_exception(RpcError(method, _int(error.get("code")),
                                      str(error.get("message") or ""), error.get("data")))

    def _lost(self, reason: str) -> None:
        """The connection is over: fail every open request and wake any waiting reader."""
        if self.closed:
            return
        self.reason = reason
        for _, future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionLost(reason))
        self._arrived.set()
        self._writer.close()


def _int(value: Any) -> int:
    """VALUE as an int (a malformed error code reads as 0)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _why(error: BaseException) -> str:
    """A short, content-free description of a socket error."""
    text = getattr(error, "strerror", None) or str(error) or "no answer"
    return f"{type(error).__name__}: {text}"

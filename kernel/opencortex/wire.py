"""The ChatEvent wire: the kernel over WebSocket (`opencortex serve --ws PORT`).

`start_wire(kernel, port=…, token=…)` serves the protocol of
`opencortex.wire_protocol` on 127.0.0.1 (by default) with the `websockets`
library; what the actions do is `opencortex.wire_service`, how turns reach
their client `opencortex.wire_turns`, sessions and replay
`opencortex.wire_session`.

Authentication: the token in an ``Authorization: Bearer`` header (with
``X-OpenCortex-Session`` / ``X-OpenCortex-Last-Sequence`` to resume), or in a
first ``auth`` frame within `auth_timeout` seconds.  A wrong token is refused
(HTTP 401, or close code 1008) and counted in the log, never shown.  Then the
kernel sends the missed events of a resumed session, a ``session`` event, and
a ``heartbeat`` every `heartbeat_seconds`.

The same limits as EPC: at most `max_connections` at once (HTTP 503 or close
code 1013 past that), frames up to `max_frame_bytes` (websockets' ``max_size``;
a bigger one closes the connection with 1009), a message's content up to
`max_content_bytes` (a bigger one is refused with INVALID_MESSAGE), and a send
queue of `send_queue_bytes` per connection: a client that stops reading is
disconnected (1008), its session kept for a resume.  Message content, tokens
and prompts are never logged.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import weakref
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from opencortex.approvals import ApprovalBook
from opencortex.throttled_log import ThrottledLog
from opencortex.kernel import Kernel
from opencortex.wire_protocol import ProtocolError, error_data, parse_frame
from opencortex.wire_service import CHANNEL, TurnLimits, WireService
from opencortex.wire_session import SessionBook, TooManySessions, WireSession
from opencortex.wire_turns import WireActuator, WireApprover

log = logging.getLogger(__name__)

AUTH_FRAME_BYTES = 4096         # an `auth` frame is ~200 bytes

# websockets logs whole frames at DEBUG: its logger here never shows them.
PROTOCOL_LOG = logging.getLogger("opencortex.wire.protocol")
PROTOCOL_LOG.setLevel(logging.WARNING)
POLICY, TRY_LATER = 1008, 1013  # WebSocket close codes


@dataclass(frozen=True)
class WireLimits:
    """The wire's bounds; see the module docstring."""

    max_connections: int = 16
    auth_timeout: float = 5.0
    max_frame_bytes: int = 1 << 20
    max_content_bytes: int = 256 << 10
    send_queue_bytes: int = 8 << 20
    heartbeat_seconds: float = 5.0
    session_ttl: float = 600.0
    max_sessions: int = 64
    replay_events: int = 4096
    replay_bytes: int = 4 << 20           # at most half the send queue: a replay fits in it
    ping_interval: float | None = 20.0   # websockets' own keepalive: a dead peer is dropped
    ping_timeout: float | None = 20.0
    close_timeout: float = 2.0
    turns: TurnLimits = field(default_factory=TurnLimits)

    def __post_init__(self) -> None:
        if self.max_content_bytes >= self.max_frame_bytes:
            raise ValueError("max_content_bytes must be below max_frame_bytes, so that "
                             "oversized content is refused with INVALID_MESSAGE")
        if 2 * self.replay_bytes > self.send_queue_bytes:
            raise ValueError("replay_bytes must be at most half of send_queue_bytes, so that "
                             "a resumed session's replay fits in the send queue")


@dataclass(frozen=True)
class Resume:
    """What a client asked for when it authenticated."""

    session_id: str | None = None
    last_sequence: int = 0


class WireConnection:
    """One authenticated WebSocket: a bounded send queue drained by one writer task,
    and the session's heartbeat while it is attached here."""

    def __init__(self, ws: ServerConnection, limits: WireLimits):
        self.ws = ws
        self.limits = limits
        self.queue: collections.deque[bytes] = collections.deque()
        self.pending = 0                     # bytes queued or being sent
        self.closed = False
        self.wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.writer = loop.create_task(self._write())
        self.heartbeat: asyncio.Task[None] | None = None
        self.closer: asyncio.Task[None] | None = None

    def enqueue(self, frame: bytes) -> None:
        """Queue FRAME; past the bound the client is disconnected (it stopped reading).
        One frame bigger than the bound still goes out when nothing else is queued."""
        if self.closed:
            return
        if self.pending and self.pending + len(frame) > self.limits.send_queue_bytes:
            log.warning("a wire client stopped reading what the kernel sends; it was "
                        "disconnected (its session is kept for a resume)")
            self.close_soon(POLICY, "too slow reading events; reconnect to resume")
            return
        self.queue.append(frame)
        self.pending += len(frame)
        self.wake.set()

    async def _write(self) -> None:
        """The writer: send queued frames in order until the connection closes."""
        try:
            while not self.closed:
                await self.wake.wait()
                self.wake.clear()
                while self.queue and not self.closed:
                    frame = self.queue[0]
                    await self.ws.send(frame, text=True)
                    self.queue.popleft()
                    self.pending -= len(frame)
        except ConnectionClosed:
            self.closed = True

    def beat(self, session: WireSession) -> None:
        """Send SESSION's heartbeat on this connection while it holds the session."""
        self.heartbeat = asyncio.get_running_loop().create_task(self._beat(session))

    async def _beat(self, session: WireSession) -> None:
        while not self.closed:
            await asyncio.sleep(self.limits.heartbeat_seconds)
            if session.outlet is self and not self.closed:
                session.emit("heartbeat", {"turns_in_flight": len(session.turns)},
                             replay=False)

    def close_soon(self, code: int, reason: str) -> None:
        """Stop sending and close the WebSocket with CODE (without waiting here)."""
        if self.closed:
            return
        self.closed = True
        self.queue.clear()
        self.wake.set()
        self.closer = asyncio.get_running_loop().create_task(self._close(code, reason))

    async def _close(self, code: int, reason: str) -> None:
        """The closing handshake, bounded: a peer that reads nothing cannot take the close
        frame either, so past `close_timeout` the TCP connection is cut."""
        try:
            await asyncio.wait_for(self.ws.close(code, reason), self.limits.close_timeout)
        except TimeoutError:
            self.ws.transport.abort()

    async def aclose(self) -> None:
        """End the writer and the heartbeat; let a close in progress finish (websockets
        bounds it by its close timeout)."""
        self.closed = True
        self.wake.set()
        tasks = [t for t in (self.writer, self.heartbeat) if t is not None]
        for task in tasks:
            task.cancel()
        if self.closer is not None:
            tasks.append(self.closer)
        await asyncio.gather(*tasks, return_exceptions=True)


class WireServer:
    """The WebSocket server, its sessions, and the kernel's "cli" actuator and approver
    while it runs."""

    def __init__(self, kernel: Kernel, token: str, *, host: str = "127.0.0.1", port: int = 0,
                 limits: WireLimits | None = None):
        if not token:
            raise ValueError("the wire needs a token")
        self.kernel = kernel
        self.token = token.encode("utf-8")
        self.host = host
        self.requested_port = port
        self.limits = limits or WireLimits()
        self.book = ApprovalBook()
        self.service = WireService(kernel, self.book, self.limits.turns)
        self.sessions = SessionBook(ttl=self.limits.session_ttl,
                                    max_sessions=self.limits.max_sessions,
                                    replay_events=self.limits.replay_events,
                                    replay_bytes=self.limits.replay_bytes)
        self.active = 0
        self.server: Server | None = None
        self._header_auth: weakref.WeakKeyDictionary[ServerConnection, Resume] = \
            weakref.WeakKeyDictionary()
        self._previous: tuple[Any, Any] = (None, None)
        self.log_wrong_token = ThrottledLog("a wire connection presented a wrong token and "
                                            "was refused")
        self.log_refused = ThrottledLog("a wire connection was refused: too many open")

    @property
    def port(self) -> int:
        assert self.server is not None, "the wire server is not started"
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Take over the kernel's "cli" actuator and approver, then listen."""
        actuators, approvers = self.kernel.actuators, self.kernel.approvers
        previous = actuators.for_target(CHANNEL) if CHANNEL in actuators.targets() else None
        self._previous = (previous, approvers.get(CHANNEL))
        actuators.register(WireActuator(previous))
        approvers[CHANNEL] = WireApprover(self.book, approvers.get(CHANNEL))
        limits = self.limits
        self.server = await serve(
            self._serve, self.host, self.requested_port, process_request=self._admit,
            max_size=limits.max_frame_bytes, max_queue=16, compression=None,
            ping_interval=limits.ping_interval, ping_timeout=limits.ping_timeout,
            close_timeout=limits.close_timeout, open_timeout=limits.auth_timeout,
            server_header=None, logger=PROTOCOL_LOG)

    async def close(self) -> None:
        """Deny pending approvals, end every turn and connection, give "cli" back."""
        for approval_id in self.book.pending():
            self.book.answer(approval_id, False)
        await self.service.close(self.sessions.all())
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        previous_actuator, previous_approver = self._previous
        if previous_actuator is not None:
            self.kernel.actuators.register(previous_actuator)
        if previous_approver is not None:
            self.kernel.approvers[CHANNEL] = previous_approver
        else:
            self.kernel.approvers.pop(CHANNEL, None)

    # -- admission --------------------------------------------------------------

    def _token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token)

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """Before the handshake: the connection cap, and the token when sent as a header."""
        if self.active >= self.limits.max_connections:
            self.log_refused()
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"the kernel has {self.limits.max_connections} wire "
                                      "connections open already (its limit)\n")
        header = request.headers.get("Authorization")
        if header is None:
            return None
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not self._token_ok(given.strip()):
            self.log_wrong_token()
            return connection.respond(HTTPStatus.UNAUTHORIZED, "authentication failed\n")
        try:
            self._header_auth[connection] = resume_from_headers(request.headers)
        except ValueError as error:
            return connection.respond(HTTPStatus.BAD_REQUEST, f"{error}\n")
        return None

    async def _authenticate(self, ws: ServerConnection) -> Resume | None:
        """The client's resume request once its token checked out; None when refused
        (the connection is then closed)."""
        resume = self._header_auth.pop(ws, None)
        if resume is not None:
            return resume
        try:
            raw = await asyncio.wait_for(ws.recv(), self.limits.auth_timeout)
        except TimeoutError:
            await ws.close(POLICY, f"no auth frame within {self.limits.auth_timeout:g} s")
            return None
        if len(raw) > AUTH_FRAME_BYTES:
            await ws.close(POLICY, "the first frame must be a small auth frame")
            return None
        try:
            frame = parse_frame(raw, max_content_bytes=0)
        except ProtocolError as error:
            await ws.close(POLICY, f"authenticate first: {error}"[:120])
            return None
        token = frame.data.get("token") if frame.action == "auth" else None
        if not isinstance(token, str) or not self._token_ok(token):
            self.log_wrong_token()
            await ws.close(POLICY, "authentication failed")
            return None
        return Resume(frame.data["session_id"], frame.data["last_sequence"])

    # -- a connection -----------------------------------------------------------

    async def _serve(self, ws: ServerConnection) -> None:
        """One connection: authenticate, attach its session, read frames until it closes."""
        if self.active >= self.limits.max_connections:
            self.log_refused()
            await ws.close(TRY_LATER, "too many wire connections open")
            return
        self.active += 1
        connection: WireConnection | None = None
        session: WireSession | None = None
        try:
            resume = await self._authenticate(ws)
            if resume is None:
                return
            connection = WireConnection(ws, self.limits)
            session = self._attach(connection, resume)
            if session is None:
                return
            connection.beat(session)
            async for raw in ws:
                self._receive(session, raw)
        except ConnectionClosed:
            pass
        finally:
            self.active -= 1
            if session is not None and connection is not None:
                session.detach(connection)
            if connection is not None:
                await connection.aclose()

    def _attach(self, connection: WireConnection, resume: Resume) -> WireSession | None:
        """Give CONNECTION its session (resumed, or new), replaying what it missed."""
        expired = False
        try:
            session = self.sessions.find(resume.session_id) if resume.session_id else None
            expired = resume.session_id is not None and session is None
            session = session or self.sessions.new()
            replayed, gap = session.attach(connection, 0 if expired else resume.last_sequence)
        except (TooManySessions, ValueError) as error:
            connection.close_soon(TRY_LATER if isinstance(error, TooManySessions) else POLICY,
                                  str(error)[:120])
            return None
        session.emit("session", {
            "session_id": session.id, "resumed": resume.session_id is not None and not expired,
            "replayed": replayed, "gap": gap, "heartbeat_seconds": self.limits.heartbeat_seconds,
            "max_content_bytes": self.limits.max_content_bytes,
            "max_frame_bytes": self.limits.max_frame_bytes}, replay=False)
        if expired:
            session.emit("error", error_data(
                "SESSION_EXPIRED", "that session is unknown or expired (events of its turns "
                "are lost); this is a new session"))
        return session

    def _receive(self, session: WireSession, raw: str | bytes) -> None:
        """One frame from an authenticated client."""
        try:
            frame = parse_frame(raw, max_content_bytes=self.limits.max_content_bytes)
        except ProtocolError as error:
            self.service.refuse(session, str(error), error.correlation_id)
            return
        self.service.dispatch(session, frame)


def resume_from_headers(headers: Headers) -> Resume:
    """The resume request of a header-authenticated handshake (ValueError if malformed)."""
    session_id = headers.get("X-OpenCortex-Session") or None
    last = headers.get("X-OpenCortex-Last-Sequence") or "0"
    if not last.isdigit() or (session_id is not None and len(session_id) > 128):
        raise ValueError("X-OpenCortex-Last-Sequence must be a whole number and "
                         "X-OpenCortex-Session at most 128 characters")
    return Resume(session_id, int(last))


async def start_wire(kernel: Kernel, *, port: int, token: str, host: str = "127.0.0.1",
                     limits: WireLimits | None = None) -> WireServer:
    """Serve the wire for KERNEL on HOST:PORT (0: any free port; see `.port`)."""
    server = WireServer(kernel, token, host=host, port=port, limits=limits)
    await server.start()
    return server

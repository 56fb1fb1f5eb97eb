"""A connection's outgoing frames: a bounded queue and one writer thread.

Whoever sends (the kernel's asyncio loop, a connection's reader thread) only
appends to the queue, which never blocks.  The writer thread drains it onto the
socket, blocking there if the peer reads slowly.  A peer that does not read at
all lets the queue grow: past `limit_bytes` (counting what is still being
written) the outbox gives up, shuts the socket down and calls `on_overflow`
once, so the peer is disconnected instead of holding memory or a thread.
"""

from __future__ import annotations

import collections
import socket
import threading
from typing import Callable


class OutboxClosed(ConnectionError):
    """The connection is closed (or was closed for not reading): nothing more is sent."""


class Outbox:
    """Frames for one socket, written in the order they were put, by one thread."""

    def __init__(self, sock: socket.socket, limit_bytes: int, *,
                 on_overflow: Callable[[], None] | None = None, name: str = "epc-writer"):
        self.sock = sock
        self.limit_bytes = limit_bytes
        self.on_overflow = on_overflow
        self.overflowed = False
        self._frames: collections.deque[bytes] = collections.deque()
        self._pending = 0           # bytes queued or being written
        self._closed = False        # no more frames are taken
        self._condition = threading.Condition()
        self._writer = threading.Thread(target=self._drain, daemon=True, name=name)
        self._writer.start()

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def put(self, frame: bytes) -> None:
        """Queue FRAME; OutboxClosed when closed, or when this frame would pass the limit."""
        with self._condition:
            if self._closed:
                raise OutboxClosed("the Emacs connection is closed")
            overflow = self._pending + len(frame) > self.limit_bytes
            if overflow:
                self._give_up()
            else:
                self._frames.append(frame)
                self._pending += len(frame)
                self._condition.notify()
        if overflow:
            if self.on_overflow:
                self.on_overflow()
            raise OutboxClosed("the Emacs connection stopped reading its replies; it was closed")

    def _give_up(self) -> None:
        """Drop what is queued and shut the socket down (with the condition held)."""
        self.overflowed = True
        self._closed = True
        self._frames.clear()
        self._condition.notify_all()
        self._shutdown_socket()

    def _shutdown_socket(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass                    # already closed or never connected

    def close(self, *, flush_timeout: float = 0.0) -> None:
        """Take no more frames; give the writer up to FLUSH_TIMEOUT seconds to send the
        rest (a refusal, a last reply), then drop what is left."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        if flush_timeout > 0 and threading.current_thread() is not self._writer:
            self._writer.join(flush_timeout)
        with self._condition:
            self._frames.clear()
            self._condition.notify_all()

    def abort(self) -> None:
        """Drop everything now and shut the socket down; the writer stops."""
        with self._condition:
            self._closed = True
            self._frames.clear()
            self._condition.notify_all()
        self._shutdown_socket()

    def _next(self) -> bytes | None:
        """The next frame to write, waiting for one; None once closed and empty."""
        with self._condition:
            while not self._frames and not self._closed:
                self._condition.wait()
            return self._frames.popleft() if self._frames else None

    def _drain(self) -> None:
        """The writer thread: write frames until closed and empty, or the socket fails."""
        while (frame := self._next()) is not None:
            try:
                self.sock.sendall(frame)
            except OSError:
                self.abort()
                return
            with self._condition:
                self._pending -= len(frame)

"""Reading EPC frames from a peer that may be hostile.

An EPC frame is 6 hexadecimal digits giving the length of the body, then the
body.  python-epc trusts the prefix (`-00001` reads until the peer closes);
here the prefix is checked, and the length bounded, before any of the body is
read.  Two readers:

- `read_frame_before(sock, cap, deadline)`: before authentication; reads the
  raw socket with an absolute deadline, so a slow or silent peer costs at most
  the deadline, and a frame over the (small) cap is refused unread.
- `read_frame(stream, cap)`: after authentication; blocking.  A frame over the
  cap is drained in pieces and returned as an `Oversized` marker (its first
  bytes only), so the connection stays usable and memory stays bounded.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from typing import BinaryIO

HEAD_BYTES = 6
FRAME_LIMIT = 0xFFFFFF
HEX_HEAD = re.compile(rb"[0-9a-fA-F]{6}")
KEPT_OF_OVERSIZED = 64
DRAIN_PIECE = 64 << 10


class FrameError(ValueError):
    """The peer broke the framing: the connection cannot go on."""


class FrameTimeout(FrameError):
    """The peer did not send a whole frame before the deadline."""


@dataclass(frozen=True)
class Oversized:
    """A frame over the cap, read and dropped: its length and its first bytes."""

    length: int
    start: bytes


def frame_length(head: bytes, cap: int) -> int:
    """The body length HEAD announces; FrameError unless it is 6 hex digits and <= CAP."""
    if not HEX_HEAD.fullmatch(head):
        raise FrameError("an EPC frame must start with its length as 6 hexadecimal digits")
    length = int(head, 16)
    if length > cap:
        raise FrameError(f"an EPC frame of {length} bytes is over the cap of {cap} bytes")
    return length


def recv_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    """SIZE bytes from SOCK, or b"" at a clean end of stream before the first byte.

    FrameTimeout when DEADLINE (time.monotonic) passes; FrameError when the peer
    closes in the middle.  Each pass receives at least one byte or ends the loop."""
    parts: list[bytes] = []
    received = 0
    while received < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FrameTimeout("no complete message before the deadline")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(size - received, DRAIN_PIECE))
        except socket.timeout:
            raise FrameTimeout("no complete message before the deadline") from None
        if not chunk:
            if received == 0:
                return b""
            raise FrameError("the connection closed in the middle of a message")
        parts.append(chunk)
        received += len(chunk)
    return b"".join(parts)


def read_frame_before(sock: socket.socket, cap: int, deadline: float) -> bytes | None:
    """The next frame's body from SOCK, None at end of stream; FrameError otherwise."""
    head = recv_exactly(sock, HEAD_BYTES, deadline)
    if not head:
        return None
    length = frame_length(head, cap)
    body = recv_exactly(sock, length, deadline)
    if len(body) < length:
        raise FrameError("the connection closed in the middle of a message")
    return body


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    """SIZE bytes from the buffered STREAM; FrameError when it ends first."""
    data = stream.read(size) if size else b""
    if len(data) < size:
        raise FrameError("the connection closed in the middle of a message")
    return data


def read_frame(stream: BinaryIO, cap: int) -> bytes | Oversized | None:
    """The next frame from STREAM: its body, Oversized past CAP, None at end of stream."""
    head = stream.read(HEAD_BYTES)
    if not head:
        return None
    if len(head) < HEAD_BYTES:
        raise FrameError("the connection closed in the middle of a message")
    length = frame_length(head, FRAME_LIMIT)
    if length <= cap:
        return read_exactly(stream, length)
    start = read_exactly(stream, KEPT_OF_OVERSIZED)
    left = length - len(start)
    while left > 0:                       # bounded: each piece shortens LEFT or raises
        left -= len(read_exactly(stream, min(left, DRAIN_PIECE)))
    return Oversized(length, start)

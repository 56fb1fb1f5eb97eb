"""EPC frames from a peer that may be hostile, parsed from bytes as they arrive.

An EPC frame is 6 hexadecimal digits giving the length of the body, then the
body.  python-epc trusts the prefix (`-00001` reads until the peer closes);
here the prefix is checked, and the length bounded, before any of the body is
kept.  `FrameBuffer` does no I/O: the connection feeds it what the socket gave
and takes whole frames out, one at a time, so a cap changed between two frames
(after authentication) applies from the next one.

- Strict (before authentication): a frame over the cap is a `FrameError`, and
  none of its body is kept.
- Draining (after): a frame over the cap is skipped as it arrives, keeping only
  its first bytes, and comes out as an `Oversized` marker, so the connection
  stays usable and memory stays bounded (the cap plus what one read gives).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEAD_BYTES = 6
FRAME_LIMIT = 0xFFFFFF
HEX_HEAD = re.compile(rb"[0-9a-fA-F]{6}")
KEPT_OF_OVERSIZED = 64


class FrameError(ValueError):
    """The peer broke the framing: the connection cannot go on."""


@dataclass(frozen=True)
class Oversized:
    """A frame over the cap, dropped as it arrived: its length and its first bytes."""

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


class FrameBuffer:
    """Bytes in, frames out: `feed` what arrived, then `next_frame` until None."""

    def __init__(self, cap: int, *, strict: bool = True):
        self.cap = cap
        self.strict = strict
        self._data = bytearray()
        self._skipping: Oversized | None = None    # a frame being dropped as it arrives
        self._left = 0                             # its bytes still to come

    @property
    def buffered(self) -> int:
        """Bytes held, waiting for the rest of their frame."""
        return len(self._data)

    def feed(self, data: bytes) -> None:
        """Take DATA (any amount; an oversized frame's body is dropped as it comes)."""
        if self._skipping is not None and not self._data:
            dropped = min(len(data), self._left)
            self._left -= dropped
            data = data[dropped:]
        self._data += data

    def next_frame(self) -> bytes | Oversized | None:
        """The next whole frame (its body), Oversized past the cap when draining, None
        until more bytes arrive; FrameError when the framing is broken."""
        if self._skipping is not None:
            return self._finish_skipping()
        data = self._data
        if len(data) < HEAD_BYTES:
            return None
        length = frame_length(bytes(data[:HEAD_BYTES]),
                              self.cap if self.strict else FRAME_LIMIT)
        if length > self.cap:
            return self._start_skipping(length)
        end = HEAD_BYTES + length
        if len(data) < end:
            return None
        body = bytes(data[HEAD_BYTES:end])
        del data[:end]
        return body

    def _start_skipping(self, length: int) -> Oversized | None:
        """Drop the frame of LENGTH bytes whose head starts the buffer; keep its start."""
        kept = HEAD_BYTES + min(length, KEPT_OF_OVERSIZED)
        if len(self._data) < kept:
            return None                    # its start is kept whole: wait for it
        start = bytes(self._data[HEAD_BYTES:kept])
        self._skipping, self._left = Oversized(length, start), length
        del self._data[:HEAD_BYTES]
        return self._finish_skipping()

    def _finish_skipping(self) -> Oversized | None:
        """Drop what is buffered of the skipped frame; the marker once it has all gone."""
        dropped = min(len(self._data), self._left)
        del self._data[:dropped]
        self._left -= dropped
        if self._left:
            return None
        skipped, self._skipping = self._skipping, None
        return skipped

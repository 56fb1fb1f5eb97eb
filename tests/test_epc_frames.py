"""`FrameBuffer`: EPC frames parsed from bytes as a hostile peer may send them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from opencortex.epc_frames import KEPT_OF_OVERSIZED, FrameBuffer, FrameError, Oversized


def frame(body: bytes) -> bytes:
    return b"%06x" % len(body) + body


def drain(buffer: FrameBuffer) -> list:
    """Every whole frame the buffer holds now (bounded: each one consumes bytes)."""
    out = []
    while (item := buffer.next_frame()) is not None:
        out.append(item)
    return out


def feed_in_pieces(buffer: FrameBuffer, data: bytes, cuts: list[int]) -> list:
    out, start = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        buffer.feed(data[start:cut])
        out += drain(buffer)
        start = cut
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(0, 3000)))
def test_frames_come_out_whole_however_the_bytes_are_cut(bodies, cuts):
    data = b"".join(frame(b) for b in bodies)
    out = feed_in_pieces(FrameBuffer(4096), data, [c for c in cuts if c <= len(data)])
    assert out == bodies


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=6), st.lists(st.integers(0, 3000)),
       st.integers(101, 2000))
def test_an_oversized_frame_is_dropped_as_it_arrives_and_the_next_one_is_read(
        bodies, cuts, big):
    oversized = b"(call 7 ping (" + b"x" * big + b"))"
    data = frame(oversized) + b"".join(frame(b) for b in bodies)
    buffer = FrameBuffer(100, strict=False)
    out, start = [], 0
    for cut in sorted({c for c in cuts if c <= len(data)}) + [len(data)]:
        buffer.feed(data[start:cut])
        out += drain(buffer)
        assert buffer.buffered <= 100 + 6 + (cut - start)   # never the whole big frame
        start = cut
    assert out == [Oversized(len(oversized), oversized[:KEPT_OF_OVERSIZED])] + bodies


def test_strict_refuses_a_frame_over_the_cap_from_its_head_alone():
    buffer = FrameBuffer(4096)
    buffer.feed(b"ffffff(")
    with pytest.raises(FrameError, match="over the cap of 4096"):
        buffer.next_frame()


@pytest.mark.parametrize("head", [b"-00001", b"0x0010", b" 00010", b"zzzzzz"])
def test_a_broken_head_is_an_error_in_both_modes(head):
    for strict in (True, False):
        buffer = FrameBuffer(4096, strict=strict)
        buffer.feed(head + b"(call 1 ping ())")
        with pytest.raises(FrameError, match="6 hexadecimal digits"):
            buffer.next_frame()


def test_a_new_cap_applies_from_the_next_frame():
    """Authentication raises the cap: a big call right behind `authenticate`, in the same
    read, is measured against the new cap."""
    buffer = FrameBuffer(16)
    buffer.feed(frame(b"(auth)") + frame(b"y" * 1000))
    assert buffer.next_frame() == b"(auth)"
    buffer.cap, buffer.strict = 4096, False
    assert buffer.next_frame() == b"y" * 1000
    assert buffer.next_frame() is None and buffer.buffered == 0


def test_an_oversized_frame_shorter_than_the_kept_start():
    buffer = FrameBuffer(10, strict=False)
    buffer.feed(frame(b"z" * 20) + frame(b"ok"))
    assert drain(buffer) == [Oversized(20, b"z" * 20), b"ok"]

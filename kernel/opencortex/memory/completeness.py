"""The complete part of a thread file: whole writes only, and the entries in it.

One append writes all its entries for a thread at once, each marked
`:PART: k/N` (see `orgformat`).  A crash can cut that write anywhere: inside an
entry (the entry is torn) or between two entries (the write stops after entry
k < N).  Either way the whole write is incomplete, and the complete part of
the file ends where that write began; a reader never sees half a turn, and
repair moves the whole write aside.  Entries without PART (files written
before it existed) count as complete writes of their own.

Finding that point reads the file backwards, entry by entry, only as far as
the last write reaches: the cost is the size of one write, never of the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from opencortex.memory.orgformat import EntryError, Part, read_entry, record_from_fields
from opencortex.memory.records import MessageRecord

HEADING_START = re.compile(rb"(?m)^\*+ ")
_ID_LINE = re.compile(rb"(?m)^:ID:[ \t]*(\S+)[ \t]*$")

# Reads the last entry of a file's first END bytes: (its offset, its bytes), or
# (None, anything) when those bytes hold no entry.
LastEntry = Callable[[int], tuple[int | None, bytes]]


class CompleteEnd(NamedTuple):
    length: int             # bytes of the complete part of the file
    last_id: str | None     # id of the last entry in it (None when there is none)
    reason: str | None      # why the bytes after LENGTH are incomplete (None: there are none)


def last_entry_start(data: bytes, end: int | None = None) -> int | None:
    """Offset of the last line starting with `*` in DATA[:END], or None if there is none."""
    end = len(data) if end is None else end
    found = data.rfind(b"\n*", 0, end)
    if found >= 0:
        return found + 1
    return 0 if end > 0 and data.startswith(b"*") else None


def last_entry_in(data: bytes) -> LastEntry:
    """A `LastEntry` reader over bytes held in memory."""
    def last_entry(end: int) -> tuple[int | None, bytes]:
        start = last_entry_start(data, end)
        return (None, b"") if start is None else (start, data[start:end])
    return last_entry


def complete_end(last_entry: LastEntry, size: int) -> CompleteEnd:
    """Where the complete part of a file of SIZE bytes ends: after its last whole write.

    The header is written together with the first write, so when no entry is
    left before an incomplete write, the complete part is empty (length 0).
    """
    start, data = last_entry(size)
    if start is None:
        return CompleteEnd(0, None, "the file holds no entry" if size else None)
    try:
        entry = read_entry(data)
    except EntryError as error:
        cut, reason = _write_of_torn_entry(last_entry, start), f"a torn entry: {error}"
    else:
        if entry.part is None or entry.part.number == entry.part.total:
            return CompleteEnd(size, entry.record.id, None)
        cut = _first_of_write(last_entry, start, entry.part)
        reason = f"the write stops after entry {entry.part}"
    previous, before = last_entry(cut)
    if previous is None:
        return CompleteEnd(0, None, reason)
    match = _ID_LINE.search(before)
    return CompleteEnd(cut, match.group(1).decode("utf-8", "replace") if match else None, reason)


def _write_of_torn_entry(last_entry: LastEntry, start: int) -> int:
    """Start of the write that the torn entry at START belongs to.

    When the entry before it is an earlier part of a write (k < N), the torn
    entry continues that write; otherwise it began a write of its own.
    """
    previous, data = last_entry(start)
    if previous is None:
        return start
    try:
        part = read_entry(data).part
    except EntryError:          # not expected: only the last write can be incomplete
        return start
    if part is None or part.number == part.total:
        return start
    return _first_of_write(last_entry, previous, part)


def _first_of_write(last_entry: LastEntry, start: int, part: Part) -> int:
    """Start of the first entry of the write whose entry PART begins at START.

    Walks back over the entries numbered PART-1 down to 1 of the same write;
    an entry that does not fit (a hand edit) stops the walk, and what was
    walked over so far is the write.
    """
    number = part.number
    while number > 1:
        previous, data = last_entry(start)
        if previous is None:
            break
        try:
            found = read_entry(data).part
        except EntryError:
            break
        if found != Part(number - 1, part.total):
            break
        start, number = previous, number - 1
    return start


def complete_length(data: bytes) -> int:
    """Length of the complete part of a thread file's bytes (an incomplete last write dropped)."""
    return complete_end(last_entry_in(data), len(data)).length


class ParsedFile(NamedTuple):
    entries: list[tuple[int, MessageRecord]]   # (offset in the file, record), in file order
    skipped: int                               # entries without the properties of a message
    length: int                                # bytes of the complete part (whole writes)


def parse_thread_file(data: bytes, base: int = 0) -> ParsedFile:
    """Parse the entries of the complete part of DATA with orgparse.

    DATA is a whole thread file, or a tail of one starting at the first entry
    of a write, whose offset in the file is BASE.
    """
    import orgparse            # ~5 ms: only when a file must be (re)indexed, not at start
    end = complete_length(data)
    text = data[:end].decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()   # the file's final newline ends the last line, it opens no new one
    root = orgparse.loadi(lines)
    starts = [m.start() for m in HEADING_START.finditer(data, 0, end)]
    entries, skipped = [], 0
    for node, start in zip(root[1:], starts, strict=True):
        props = {key: str(value) for key, value in node.properties.items()}
        try:
            record = record_from_fields(props, node.get_body(format="raw").split("\n"),
                                        check_length=False)
        except EntryError:
            skipped += 1
            continue
        entries.append((base + start, record))
    return ParsedFile(entries, skipped, end)

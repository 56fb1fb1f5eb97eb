"""Resuming a thread from the tail of its org file, without reading the rest.

`read_tail` reads the file backwards, entry by entry, until it has:

1. the newest checkpoint (see `checkpoint`): the log's state before one turn
   was written, checked against the file (the entry just before that write
   is the one the writer had seen last, and the file's first message is the
   one it knew of: no other process wrote in between, nothing was forgotten);
2. everything written after it, which must only continue the current branch
   or pin, unpin, choose a strategy, store a summary or a checkpoint (a fork, rewind or
   switch since then, or messages that do not follow the head, need the whole
   graph);
3. the current branch back from the checkpoint's head: at least WINDOW
   messages (or to its first), far enough to tell for every pin whether it is
   on the branch, and back to the oldest message the working context held and
   the newest small talk it let go (the checkpoint names them), so that a start
   restores that context whole.

Its cost follows the window, not the thread.  A short file is read whole.
When any check fails, or more than TAIL_LIMIT entries would be needed, it
answers None and the caller reads the thread whole (`ThreadLog.load`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from opencortex.conversation.branches import CONTROL, is_control
from opencortex.conversation.checkpoint import CHECKPOINT, Checkpoint, parse_checkpoint
from opencortex.events import Thread
from opencortex.memory import MessageRecord
from opencortex.memory.completeness import complete_end
from opencortex.memory.orgformat import EntryError, Part, read_entry
from opencortex.memory.threadfile import (entries_backwards, locked, read_last_entry,
                                          read_range)

TAIL_LIMIT = 8000            # entries read back at most; beyond, the thread is read whole
CARRIER_SEARCH = 512         # entries read back at most looking for the newest checkpoint
FIRST_BYTES = 1 << 16        # bytes first read from the start to find the first message
FIRST_LIMIT = 1 << 22        # ... and at most, doubling
STALE_SEARCH = 256           # entries read back after a write to find its predecessor
# the control records a resume replays after a checkpoint
AFTER_CHECKPOINT = ("pin", "unpin", "strategy", "summary", "checkpoint", "delivery")
_HEADING = re.compile(rb"(?m)^\* ")


class Unusable(Exception):
    """The tail cannot stand for the thread: read it whole."""


@dataclass
class Tail:
    """What `read_tail` found.  With COMPLETE, RECORDS are the whole thread."""

    complete: bool
    records: list[MessageRecord]            # file order
    checkpoint: Checkpoint | None = None
    split: int = 0                          # records[split:] are the checkpoint's write and later
    path: list[str] = field(default_factory=list)      # root-ward part of the branch to the head
    off_path: set[str] = field(default_factory=set)    # loaded messages known to be off it


class _Backwards:
    """The entries of a file, parsed newest first, as far as they were needed."""

    def __init__(self, fd: int, end: int, thread: Thread):
        self._entries = entries_backwards(fd, end)
        self.thread = thread
        self.read: list[tuple[int, MessageRecord, Part | None]] = []
        self.index: dict[str, int] = {}
        self.done = False                   # the start of the file was reached

    def more(self) -> bool:
        """Read one more (older) entry; False at the start of the file or the limit."""
        if self.done or len(self.read) >= TAIL_LIMIT:
            return False
        try:
            offset, data = next(self._entries)
        except StopIteration:
            self.done = True
            return False
        entry = read_entry(data)
        record = entry.record
        if record.thread != self.thread or record.id in self.index:
            raise Unusable("an entry of another thread, or an id seen twice")
        self.index[record.id] = len(self.read)
        self.read.append((offset, record, entry.part))
        return True

    def has(self, position: int) -> bool:
        """Whether entry POSITION (0 = newest) is read, reading on as needed."""
        while len(self.read) <= position:
            if not self.more():
                return False
        return True

    def find(self, message_id: str) -> int | None:
        """The position of MESSAGE_ID, reading on until it is found (None: not found)."""
        while message_id not in self.index:
            if not self.more():
                return None
        return self.index[message_id]

    def record(self, position: int) -> MessageRecord:
        """The record of entry POSITION (already read)."""
        return self.read[position][1]


def read_tail(path: Path, thread: Thread, window: int) -> Tail | None:
    """The tail of THREAD's file at PATH that resumes it (see the module); None when
    the thread must be read whole."""
    try:
        with locked(path, exclusive=False) as fd:
            end = complete_end(partial(read_last_entry, fd), os.fstat(fd).st_size).length
            reader = _Backwards(fd, end, thread)
            return _resume(reader, lambda: _first_message(fd, end), window)
    except FileNotFoundError:
        return Tail(complete=True, records=[])
    except (Unusable, EntryError):
        return None


def _whole(reader: _Backwards) -> Tail | None:
    """Everything read, when that is the whole file."""
    while reader.more():
        pass
    if not reader.done:
        return None
    return Tail(complete=True, records=[record for _, record, _ in reversed(reader.read)])


def _resume(reader: _Backwards, first_message: Callable[[], str | None],
            window: int) -> Tail | None:
    """The tail from the newest checkpoint (FIRST_MESSAGE reads the file's first
    message id when needed), or the whole file when it is short."""
    position = 0
    while True:
        if not reader.has(position):
            return _whole(reader)
        if CHECKPOINT in reader.record(position).extra:
            break
        if position >= CARRIER_SEARCH:
            return None
        position += 1
    checkpoint = parse_checkpoint(reader.record(position).extra[CHECKPOINT])
    if checkpoint is None:
        return None
    oldest = _write_start(reader, position)
    if not _unchanged_before(reader, oldest, checkpoint, first_message):
        return None
    _check_after(reader, oldest, checkpoint)
    path, off_path = _branch(reader, checkpoint, window, oldest)
    if reader.done:
        return _whole(reader)
    records = [record for _, record, _ in reversed(reader.read)]
    return Tail(False, records, checkpoint, len(records) - 1 - oldest, path, off_path)


def _write_start(reader: _Backwards, position: int) -> int:
    """The position of the first entry of the write holding entry POSITION, its parts checked."""
    part = reader.read[position][2]
    if part is None or position < part.total - part.number:
        raise Unusable("a checkpoint outside a whole write")
    first = position + part.number - 1
    for at in range(position - (part.total - part.number), first + 1):
        if not reader.has(at) or reader.read[at][2] != Part(part.number - (at - position),
                                                           part.total):
            raise Unusable("the checkpoint's write is not whole")
    return first


def _unchanged_before(reader: _Backwards, oldest: int, checkpoint: Checkpoint,
                      first_message) -> bool:
    """Whether the file before the write at OLDEST is what the checkpoint's writer saw."""
    before = reader.record(oldest + 1).id if reader.has(oldest + 1) else None
    if before is None and not reader.done:
        return False
    if before != checkpoint.seen:
        return False
    first = first_message()
    if checkpoint.first is None:      # no message before the write: the first comes in or after it
        return first is None or reader.index.get(first, oldest + 1) <= oldest
    return first == checkpoint.first


def _check_after(reader: _Backwards, oldest: int, checkpoint: Checkpoint) -> None:
    """The checkpoint's write and what follows only continue its head (else Unusable)."""
    head = checkpoint.head
    for position in range(oldest, -1, -1):
        record = reader.record(position)
        if is_control(record):
            if record.extra.get(CONTROL) not in AFTER_CHECKPOINT:
                raise Unusable("a branch changed after the checkpoint")
            continue
        parent = record.parent
        if parent is not None:
            at = reader.find(parent)
            if at is None:
                raise Unusable("a parent that is not in the tail")
            if is_control(reader.record(at)):
                parent = head         # written after a control record: it continues the head
        if parent != head:
            raise Unusable("a message that does not continue the head")
        head = record.id


def _branch(reader: _Backwards, checkpoint: Checkpoint, window: int, oldest: int
            ) -> tuple[list[str], set[str]]:
    """The branch back from the checkpoint's head (oldest first) and the loaded messages
    older than the checkpoint's write (at OLDEST) known to be off it: WINDOW messages
    or more, and every pin, the working context's oldest message and the newest small
    talk it let go placed."""
    context = checkpoint.context
    placed = set(checkpoint.pins) | {i for i in (context.oldest, context.smalltalk) if i} \
        if context else set(checkpoint.pins)
    pins = {pin: reader.find(pin) for pin in placed}
    if None in pins.values():
        raise Unusable("a pin or the context's start older than the tail")
    path: list[str] = []
    here = checkpoint.head
    while here is not None:
        position = reader.find(here)
        if position is None or is_control(reader.record(position)):
            raise Unusable("the branch leaves the tail")
        path.append(here)
        here = reader.record(position).parent
        if len(path) >= window and all(at < position for at in pins.values()):
            break
    floor = len(reader.read) if here is None else reader.index[path[-1]]   # root: all off
    on_path = set(path)
    off_path = {record.id for _, record, _ in reader.read[oldest + 1:floor]
                if record.id not in on_path and not is_control(record)}
    path.reverse()
    return path, off_path


def _first_message(fd: int, end: int) -> str | None:
    """The id of the first conversation message of the file (None: there is none)."""
    size = FIRST_BYTES
    while True:
        data = read_range(fd, 0, min(end, size))
        whole = len(data) >= end
        starts = [m.start() for m in _HEADING.finditer(data)] + [len(data)]
        for begin, stop in zip(starts, starts[1:]):
            if stop == len(data) and not whole:
                break                 # this entry goes on past what was read
            record = read_entry(data[begin:stop]).record
            if not is_control(record):
                return record.id
        if whole:
            return None
        if size >= FIRST_LIMIT:
            raise Unusable("the first message is too far from the start")
        size *= 2


def predecessor(path: Path, message_id: str) -> tuple[bool, str | None]:
    """(found, id of the entry just before MESSAGE_ID) in the file at PATH, looking only
    at its newest STALE_SEARCH entries."""
    try:
        with locked(path, exclusive=False) as fd:
            found = False
            for count, (_, data) in enumerate(entries_backwards(fd, os.fstat(fd).st_size)):
                if count > STALE_SEARCH and not found:
                    break
                match = _ID.search(data)
                if found:
                    return True, match.group(1).decode("utf-8") if match else None
                found = match is not None and match.group(1).decode("utf-8") == message_id
            return found, None
    except (FileNotFoundError, UnicodeDecodeError):
        return False, None


_ID = re.compile(rb"(?m)^:ID:[ \t]*(\S+)[ \t]*$")

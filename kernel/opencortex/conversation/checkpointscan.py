"""The checkpoint a thread's end needs, worked out by counting, never holding the thread.

`memory import` fills threads by other means than turns and then ends each long
one with a checkpoint (see `checkpoint`), so a start resumes it from the tail
of its file.  Working that checkpoint out by replaying the thread
(`ThreadLog.load`) held every message in memory: about 300 MB per 100k.
`scan_checkpoint` pages through the thread newest first, PAGE messages at a
time (from the index, which `ThreadLog.load` replays too), and keeps counts
only, back to the newest checkpoint it can trust, or to the thread's start:

- the state that checkpoint names (an empty thread's, at the start), and
- what the entries after it add: turns, tokens, the head, the last entry seen,
  and the newest pin or unpin of each message, strategy and summary.

A checkpoint is trusted as `resume` trusts one: its write is found by the
`:PART:` of the entry carrying it (read from the file), the entry before that
write is the one it saw, and the thread's first message is the one it knew; a
checkpoint that is not trusted is passed over, as a replay passes over all.

Counts stand for a replay only when everything after that point continues one
branch, as imports, turns, pins, strategy and summary records do: each message
follows the one before it, or the control record just before it (which a
replay reads as the head).  After a fork, rewind, switch or merge, or a message
that follows another, `scan_checkpoint` answers None: replay the thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from opencortex.conversation.branches import CONTROL, MAIN, TARGET, VALUE, is_control
from opencortex.conversation.checkpoint import CHECKPOINT, Checkpoint, parse_checkpoint
from opencortex.conversation.resume import AFTER_CHECKPOINT
from opencortex.conversation.storedsummaries import stored_summary
from opencortex.conversation.turns import record_tokens
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord
from opencortex.memory.completeness import complete_end
from opencortex.memory.orgformat import EntryError, Part, read_entry
from opencortex.memory.threadfile import locked, read_last_entry, read_range

PAGE = 1000                  # messages read from the index at a time
EMPTY = Checkpoint(head=None, branch=MAIN, turns=0, tokens=0, seen=None, first=None,
                   strategy=None, pins=frozenset())       # a thread before its first entry
_SETTLED = object()          # the oldest message counted follows whatever came before it


class _Branched(Exception):
    """Something after the base does not continue one branch: counts cannot tell."""


@dataclass(frozen=True)
class Scanned:
    """A thread's end as a checkpoint records it, and how long its current branch is."""

    checkpoint: Checkpoint
    messages: int            # messages of the branch: all of them when EXACT, else at least
    exact: bool


class _Tally:
    """What the entries after the base add, taken newest first."""

    def __init__(self) -> None:
        self.seen: str | None = None          # the newest entry
        self.head: str | None = None          # the newest conversation message
        self.users = self.tokens = self.messages = 0
        self.oldest: MessageRecord | None = None     # the oldest conversation message
        self.expected: object = _SETTLED      # the PARENT that oldest message names
        self.after_message = False            # the last entry taken was that message
        self.pins: dict[str, bool] = {}       # message -> pinned, by the newest record
        self.strategy: tuple[str | None] | None = None   # by the newest record, if any
        self.summaries: dict[str, str] = {}   # branch -> its newest summary record

    def take(self, record: MessageRecord) -> None:
        """Count RECORD, the entry just before those taken so far (_Branched if a replay
        would leave the branch there)."""
        if self.seen is None:
            self.seen = record.id
        if is_control(record):
            self._control(record)
        else:
            self._message(record)

    def _message(self, record: MessageRecord) -> None:
        if self.oldest is not None and self.expected is not _SETTLED and \
                self.expected != record.id:
            raise _Branched("a message that does not follow the one before it")
        self.users += record.role == "user"
        self.tokens += record_tokens(record)
        self.messages += 1
        self.head = self.head or record.id
        self.oldest, self.expected, self.after_message = record, record.parent, True

    def _control(self, record: MessageRecord) -> None:
        if self.after_message and self.expected == record.id:
            self.expected = _SETTLED        # a replay reads it as the head before
        self.after_message = False
        kind = record.extra.get(CONTROL)
        if kind not in AFTER_CHECKPOINT:
            raise _Branched("a branch changed")
        if kind == "summary":
            summary = stored_summary(record)
            if summary is not None:
                self.summaries.setdefault(summary.branch, record.id)
        elif kind in ("pin", "unpin") and record.extra.get(TARGET):
            self.pins.setdefault(record.extra[TARGET], kind == "pin")
        elif kind == "strategy" and self.strategy is None:
            self.strategy = (record.extra.get(VALUE) or None,)

    def follows(self, head: str | None, before: MessageRecord | None) -> bool:
        """Whether the oldest message counted continues HEAD, the base's head; BEFORE
        is the entry just before the base (None: there is none)."""
        if self.oldest is None or self.expected is _SETTLED or self.expected == head:
            return True
        return self.after_message and before is not None and is_control(before) and \
            before.id == self.expected

    def on(self, base: Checkpoint) -> Checkpoint:
        """The checkpoint after BASE and everything counted."""
        oldest = self.oldest
        first_turn = base.head is None and oldest is not None and oldest.role != "user"
        unpinned = {target for target, pinned in self.pins.items() if not pinned}
        pinned = {target for target, pinned in self.pins.items() if pinned}
        return Checkpoint(
            head=self.head or base.head, branch=base.branch,
            turns=base.turns + self.users + first_turn, tokens=base.tokens + self.tokens,
            seen=self.seen or base.seen,
            first=base.first if base.first is not None else oldest and oldest.id,
            strategy=base.strategy if self.strategy is None else self.strategy[0],
            pins=frozenset((base.pins - unpinned) | pinned),
            summary=self.summaries.get(base.branch, base.summary))


@dataclass
class _Candidate:
    """A checkpoint met on the way back, waiting for the entry before its write."""

    checkpoint: Checkpoint
    left: int                 # entries of its write still to take


def scan_checkpoint(archive: Archive, thread: Thread) -> Scanned | None:
    """The checkpoint at the end of THREAD as `ThreadLog.load` would work it out, and
    its branch's length; None when counting cannot tell (see the module)."""
    tally, candidate, newer = _Tally(), None, None
    try:
        for offset, record in _newest_first(archive, thread):
            if candidate is not None and candidate.left == 0:
                if _trusted(archive, thread, candidate.checkpoint, tally, record):
                    return _scanned(tally, candidate.checkpoint)
                candidate = None
            tally.take(record)
            if candidate is not None:
                candidate.left -= 1
            elif CHECKPOINT in record.extra:
                candidate = _candidate(archive.thread_file(thread), record, offset, newer)
            newer = offset
        if candidate is not None and candidate.left == 0 and \
                _trusted(archive, thread, candidate.checkpoint, tally, None):
            return _scanned(tally, candidate.checkpoint)
        if tally.follows(None, None):
            return Scanned(tally.on(EMPTY), tally.messages, exact=True)
    except _Branched:
        pass
    return None


def _newest_first(archive: Archive, thread: Thread) -> Iterator[tuple[int, MessageRecord]]:
    """(offset, record) of THREAD's entries, newest first, read PAGE at a time."""
    before = None
    while True:
        page = archive.records_before(thread, before, PAGE)
        yield from page
        if len(page) < PAGE:
            return
        before = page[-1][0]


def _candidate(path: Path, record: MessageRecord, offset: int,
               end: int | None) -> _Candidate | None:
    """The checkpoint RECORD (the entry at OFFSET, ending at END or with the file)
    carries, waiting for the rest of its write; None when it is not one."""
    checkpoint = parse_checkpoint(record.extra[CHECKPOINT])
    part = _part_at(path, offset, end)
    if checkpoint is None or part is None:
        return None
    return _Candidate(checkpoint, part.number - 1)


def _part_at(path: Path, start: int, end: int | None) -> Part | None:
    """The `:PART:` of the entry of the file at PATH from START to END (None: to the end
    of its complete writes); None when it has none or cannot be read."""
    try:
        with locked(path, exclusive=False) as fd:
            if end is None:
                end = complete_end(partial(read_last_entry, fd), os.fstat(fd).st_size).length
            return read_entry(read_range(fd, start, end)).part
    except (OSError, EntryError):
        return None


def _trusted(archive: Archive, thread: Thread, checkpoint: Checkpoint, tally: _Tally,
             before: MessageRecord | None) -> bool:
    """Whether CHECKPOINT can stand for what came before its write: BEFORE, the entry
    before that write (None: none), is the one it saw, and the first message the one
    it knew (or, knowing none, the first counted).  _Branched when it can, but what
    was counted after it does not continue its head."""
    if (before.id if before is not None else None) != checkpoint.seen:
        return False
    oldest = tally.oldest.id if tally.oldest is not None else None
    if archive.first_message_id(thread) != (checkpoint.first or oldest):
        return False
    if not tally.follows(checkpoint.head, before):
        raise _Branched("the messages after a checkpoint do not follow its head")
    return True


def _scanned(tally: _Tally, base: Checkpoint) -> Scanned:
    """The result from BASE, a trusted checkpoint: its branch had at least a message a
    turn before its write (how many more, counts cannot tell)."""
    return Scanned(tally.on(base), base.turns + tally.messages, exact=False)

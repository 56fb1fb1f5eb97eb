"""How a thread log resumes from the tail of its file, and what it writes for that.

`Resumable` is a part of `ThreadLog` (kept apart for size).  `resume` opens a
thread from the newest checkpoint and the tail of its file (see `resume`,
`checkpoint`); such a log is *partial* until something needs more of the graph
(`_complete` then replays the whole thread once).  Every write goes through
`_write` (in the calling thread) or `_write_async` (by the archive's writer
thread, off the event loop), which apply the records only once they are
durable, and check that the entry just before the write is the last one this
log knew of: if not, another process wrote to the thread, and this log writes
no more checkpoints (a resume would otherwise trust a view that is not the
file's).  Summary records are written and kept here too, and so is the newest
checkpoint of the current branch, which says where the working context started
(`newest_checkpoint`), with what came after it that a restart replays on it
(`since_checkpoint`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from opencortex.conversation.branches import CONTROL, is_control
from opencortex.conversation.checkpoint import (CHECKPOINT, Checkpoint, ContextMark,
                                                checkpoint_message, parse_checkpoint)
from opencortex.conversation.resume import AFTER_CHECKPOINT, Tail, predecessor, read_tail
from opencortex.conversation.storedsummaries import StoredSummary, is_summary, stored_summary
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, NewMessage
from opencortex.memory.writer import Appended, settled

LAND_TIMEOUT = 60.0     # seconds a write waits for this log's write in flight, at most
SUMMARIES_SINCE = 8     # summaries kept after a checkpoint a restart may make again


@dataclass
class SinceCheckpoint:
    """What a log took in after its newest checkpoint: a restart replays it."""

    carrier: str                                # the id of the record carrying it
    with_turn: bool = True                      # a message of a turn (else a control record)
    pinned: frozenset[str] | None = None        # the pins after the newest pin since
    strategies: tuple[str | None, ...] = ()     # the strategies chosen since, in order
    summaries: tuple[StoredSummary, ...] = ()   # the summaries kept since on the branch,
                                                # newest first (SUMMARIES_SINCE at most)


class Resumable:
    """Resume, checkpoints, checked writes and summary records for a ThreadLog."""

    @classmethod
    def resume(cls, archive: Archive, thread: Thread, *, window: int) -> Resumable:
        """Open THREAD reading only the tail of its file that holds the newest WINDOW
        messages of the current branch; `load` when the tail cannot tell."""
        log = cls(archive, thread)
        tail = read_tail(log._file, log.thread, window) if log._file is not None else None
        if tail is None:
            return cls.load(archive, thread)
        if tail.complete:
            for record in tail.records:
                log._apply(record)
            return log
        try:
            log._start_from(tail)
        except (KeyError, ValueError):      # a checkpoint its branch contradicts
            return cls.load(archive, thread)
        return log

    def _start_from(self, tail: Tail) -> None:
        """Take the state of TAIL's checkpoint, its branch, then replay its write and later."""
        checkpoint: Checkpoint = tail.checkpoint
        for record in tail.records[:tail.split]:
            if is_control(record):
                self._controls.add(record.id)
                self._keep_summary(record)
            else:
                self._records[record.id] = record
                self._parent[record.id] = record.parent
        self._state.tips = {checkpoint.branch: checkpoint.head}
        self._state.current = checkpoint.branch
        self._state.pins = set(checkpoint.pins)
        self._state.strategy = checkpoint.strategy
        self._newest_summary = {checkpoint.branch: checkpoint.summary} \
            if checkpoint.summary else {}
        self._path, self._path_head = list(tail.path), checkpoint.head
        rooted = not self._path or self._records[self._path[0]].parent is None
        self._turn_starts = [i for i, mid in enumerate(self._path)
                             if self._records[mid].role == "user" or (i == 0 and rooted)]
        self._turn_base = checkpoint.turns - len(self._turn_starts)
        self._head_tokens = checkpoint.tokens
        self._partial, self._rooted = True, rooted
        self._off_path = set(tail.off_path)
        self._first_message = checkpoint.first
        self._last_seen = tail.records[tail.split - 1].id if tail.split else None
        if self._turn_base < 0 or (rooted and self._turn_base):
            raise ValueError("a checkpoint that does not match its branch")   # not expected
        for record in tail.records[tail.split:]:
            self._apply(record)

    def _complete(self) -> None:
        """Make a partial log whole: replay the thread from the archive."""
        if not self._partial:
            return
        self._land()
        whole = type(self).load(self.archive, self.thread)
        self.__dict__.update(whole.__dict__)     # its view is the file's: not stale

    def _keep_summary(self, record: MessageRecord) -> bool:
        """Keep RECORD when it is a summary record (a malformed one is skipped); whether
        it was one."""
        if not is_summary(record):
            return False
        summary = stored_summary(record)
        if summary is not None:
            self._summaries.append(summary)
            self._newest_summary[summary.branch] = summary.record_id
        return True

    def _write(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """Append MESSAGES in one archive write, in this thread, then apply them."""
        self._land()
        seen = self._last_seen
        records = self.archive.append(messages)
        if self._file is None or not records:
            return self._take(seen, Appended(records, {}))
        found, before = predecessor(self._file, records[0].id)
        return self._take(seen, Appended(records, {self.thread: before} if found else {}))

    async def _write_async(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """`_write` by the archive's writer thread (a group commit): the event loop does
        not wait for the disk, and the records are applied once they are durable (even
        when the awaiting task is cancelled meanwhile).  Callers build MESSAGES from
        the state after `_landed`."""
        if not isinstance(self.archive, Archive):
            return self._write(messages)
        future = self.archive.submit(messages)
        take = partial(self._take, self._last_seen)
        self._in_flight = (future, take)
        try:
            return await settled(future, take)
        finally:
            if self._in_flight is not None and self._in_flight[0] is future:
                self._in_flight = None

    async def _landed(self) -> None:
        """Wait until no write of this log is in flight (another task's: a command
        beside a turn), so the next write starts from the state after it."""
        while self._in_flight is not None:
            await asyncio.wait([asyncio.wrap_future(self._in_flight[0])])
            self._land()

    def _land(self) -> None:
        """Apply this log's write in flight first (waiting for it, bounded): writes reach
        memory in the order they reach the file.  Applying twice changes nothing."""
        if self._in_flight is None:
            return
        (future, take), self._in_flight = self._in_flight, None
        try:
            take(future.result(timeout=LAND_TIMEOUT))
        except Exception:       # it failed (its turn reports that) or hangs
            pass

    def _take(self, seen: str | None, appended: Appended) -> list[MessageRecord]:
        """Apply the records of a write made when SEEN was the newest entry applied.  When
        the entry before the write is another, another process wrote to the thread:
        this log's view is not the file's, so it writes no more checkpoints."""
        records = appended.records
        if self._file is not None and records and (
                self.thread not in appended.before or appended.before[self.thread] != seen):
            self._stale = True
        for record in records:
            self._apply(record)
        return records

    def summaries(self) -> list[StoredSummary]:
        """The newest summary records of the thread (any branch), newest first."""
        return list(reversed(self._summaries))

    def branch_summary(self) -> StoredSummary | None:
        """The newest summary record of the current branch, None when it has none; a
        partial log that does not hold it (it lies before the tail) is made whole."""
        wanted = self._newest_summary.get(self.branch)
        if wanted is None:
            return None
        if all(summary.record_id != wanted for summary in self._summaries):
            self._complete()
        return next((s for s in self._summaries if s.record_id == wanted), None)

    def kept_summary(self, entry_id: str) -> StoredSummary | None:
        """The summary record whose context entry is ENTRY_ID (None when the log holds none:
        a partial log that does not is made whole first)."""
        found = next((s for s in self._summaries if s.entry_id == entry_id), None)
        if found is None and self._partial:
            self._complete()
            found = next((s for s in self._summaries if s.entry_id == entry_id), None)
        return found

    def checkpoint(self, context: ContextMark | None = None) -> dict[str, str]:
        """The `:CHECKPOINT:` extra property for the next write ({} for a log of working
        memory, or one that saw another process write); CONTEXT says where the working
        context started (None: not known)."""
        state = self._checkpoint_state(context)
        return {} if state is None else {CHECKPOINT: state.render()}

    def _checkpoint_state(self, context: ContextMark | None = None) -> Checkpoint | None:
        """The log's state as a checkpoint records it, CONTEXT where the working context
        started (None: see `checkpoint`)."""
        if self._file is None or self._stale:
            return None
        return Checkpoint(
            head=self.head, branch=self.branch, turns=self.turn_count(),
            tokens=self._head_tokens, seen=self._last_seen, first=self._first_message,
            strategy=self.strategy, pins=frozenset(self._state.pins),
            summary=self._newest_summary.get(self.branch), context=context)

    def _note_checkpoint(self, record: MessageRecord) -> None:
        """Keep RECORD, applied in file order, when it carries a checkpoint; a change of
        branch or head since the newest one makes it another branch's (forgotten)."""
        if CHECKPOINT in record.extra:
            self._checkpointed = record
            self._since = SinceCheckpoint(record.id, with_turn=not is_control(record))
        elif is_control(record) and record.extra.get(CONTROL) not in AFTER_CHECKPOINT:
            self._checkpointed = self._since = None

    def _note_since(self, record: MessageRecord) -> None:
        """Note control RECORD, just applied, when it follows the newest checkpoint: a pin
        (the pins now), a strategy chosen, a summary kept on the current branch."""
        since, kind = self._since, record.extra.get(CONTROL)
        if since is None:
            return
        if kind == "pin":
            since.pinned = frozenset(self._state.pins)
        elif kind == "strategy":
            since.strategies += (self._state.strategy,)
        elif kind == "summary":
            summary = stored_summary(record)
            if summary is not None and summary.branch == self.branch:
                since.summaries = (summary, *since.summaries[:SUMMARIES_SINCE - 1])

    def since_checkpoint(self) -> SinceCheckpoint | None:
        """What came after the newest checkpoint (see `newest_checkpoint`), None without one."""
        return self._since if self._checkpointed is not None else None

    def newest_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint written on the current branch with nothing but turns, pins,
        strategies and summaries after it; None when there is none, or it was edited."""
        record = self._checkpointed
        return parse_checkpoint(record.extra[CHECKPOINT]) if record is not None else None

    def write_checkpoint(self, context: ContextMark | None = None) -> MessageRecord | None:
        """Archive a checkpoint control record (a write of its own) so the next start
        resumes from here, with the working context CONTEXT describes (None: not
        known); None when this log may not write one (see `checkpoint`).  For a thread
        filled by other means (`memory import`): a turn writes its own."""
        self._land()
        state = self._checkpoint_state(context)
        return self._write([checkpoint_message(self.thread, state)])[0] \
            if state is not None else None

    async def write_checkpoint_async(self, context: ContextMark) -> MessageRecord | None:
        """`write_checkpoint` by the archive's writer thread."""
        await self._landed()
        state = self._checkpoint_state(context)
        return (await self._write_async([checkpoint_message(self.thread, state)]))[0] \
            if state is not None else None

    def keep_summary(self, message: NewMessage) -> MessageRecord:
        """Archive MESSAGE, a summary record (see `storedsummaries`), in a write of its own."""
        self._check_summary(message)
        return self._write([message])[0]

    async def keep_summary_async(self, message: NewMessage) -> MessageRecord:
        """`keep_summary` by the archive's writer thread."""
        self._check_summary(message)
        await self._landed()
        return (await self._write_async([message]))[0]

    def _check_summary(self, message: NewMessage) -> None:
        if not is_summary(message) or message.thread != self.thread:
            raise ValueError("keep_summary takes a summary record of this thread")

"""How a thread log resumes from the tail of its file, and what it writes for that.

`Resumable` is a part of `ThreadLog` (kept apart for size).  `resume` opens a
thread from the newest checkpoint and the tail of its file (see `resume`,
`checkpoint`); such a log is *partial* until something needs more of the graph
(`_complete` then replays the whole thread once).  Every write goes through
`_write`, which checks that the entry just before it is the last one this log
knew of: if not, another process wrote to the thread, and this log writes no
more checkpoints (a resume would otherwise trust a view that is not the
file's).  Summary records are written and kept here too.
"""

from __future__ import annotations

from collections.abc import Sequence

from opencortex.conversation.branches import is_control
from opencortex.conversation.checkpoint import CHECKPOINT, Checkpoint
from opencortex.conversation.resume import Tail, predecessor, read_tail
from opencortex.conversation.storedsummaries import StoredSummary, is_summary, stored_summary
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, NewMessage


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
        return True

    def _write(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """Append MESSAGES in one archive write, then apply them.  When the entry before
        the write is not the last one this log knew of, another process wrote to the
        thread: this log's view is not the file's, so it writes no more checkpoints."""
        seen = self._last_seen
        records = self.archive.append(messages)
        if self._file is not None and not self._stale and records:
            found, before = predecessor(self._file, records[0].id)
            self._stale = not found or before != seen
        for record in records:
            self._apply(record)
        return records

    def summaries(self) -> list[StoredSummary]:
        """The newest summary records of the thread (any branch), newest first."""
        return list(reversed(self._summaries))

    def checkpoint(self) -> dict[str, str]:
        """The `:CHECKPOINT:` extra property for the next write ({} for a log of working
        memory, or one that saw another process write)."""
        if self._file is None or self._stale:
            return {}
        return {CHECKPOINT: Checkpoint(
            head=self.head, branch=self.branch, turns=self.turn_count(),
            tokens=self._head_tokens, seen=self._last_seen, first=self._first_message,
            strategy=self.strategy, pins=frozenset(self._state.pins)).render()}

    def keep_summary(self, message: NewMessage) -> MessageRecord:
        """Archive MESSAGE, a summary record (see `storedsummaries`), in a write of its own."""
        if not is_summary(message) or message.thread != self.thread:
            raise ValueError("keep_summary takes a summary record of this thread")
        return self._write([message])[0]

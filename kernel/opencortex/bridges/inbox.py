"""A bridge's durable inbox: no message is lost, none is handled twice.

Platforms acknowledge delivery in batches (Telegram confirms a whole batch by
asking for the next), while a turn may take minutes (a model, an approval).
So the bridge writes each fetched message here — one JSON line, fsynced —
before it acknowledges it to the platform, and marks it done once handled:
its turn archived, or deliberately dropped (a stranger, a flood).  On start the
messages not marked done are handed out again; one whose turn was archived
before the crash is recognised by its platform message id in the archive (see
`opencortex.bridges.service`) and not answered twice.

Platforms may deliver out of order (a Telegram webhook retries a refused update
after later ones were taken), so what was handled is remembered by position: the
last `DONE_WINDOW` done positions exactly, and below them a floor.  A message is
new when it is not pending, not among the done ones, and above the floor.

Positions need not rise for ever: Telegram picks the next update id at random
after a week without updates, and another bot token has ids of its own.  A
platform never hands out again what it was told arrived, and what it hands out
again after a crash is recent (at most `RESTART_GAP` under the highest position
kept).  So a position under the floor, or a done one further than that under the
highest, starts a new sequence: it is taken, a warning is logged (no content),
and the done window starts afresh from it.

The file lives in the kernel home (mode 0600).  It holds message text only
until the message is done: every `COMPACT_AFTER` lines it is rewritten to the
floor, the done window and the messages still pending, so redelivered positions
are skipped and a long turn does not keep done messages' text on disk.

The disk is never touched on the event loop: the inbox's own thread writes,
in order, what the loop decided (`keep` waits for its fsync there).  A done
mark is written without an fsync of its own; the next kept batch's fsync (or a
compaction) makes it durable, and a mark lost to a power cut only hands a
message out again, which the archive recognises as answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from opencortex.bridges.inbound import Inbound
from opencortex.files import replace_file

log = logging.getLogger(__name__)

COMPACT_AFTER = 1000   # lines (beyond the pending messages) before the file is rewritten
DONE_WINDOW = 10_000   # done positions remembered exactly
RESTART_GAP = 1000     # a done position further under the highest starts a new sequence


class Inbox:
    """Pending messages of one bridge, kept on disk."""

    def __init__(self, path: Path):
        self.path = path
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.floor = -1                      # positions at or below it count as done
        self._done: dict[int, None] = {}     # the latest done positions, oldest first
        self._pending: dict[int, Inbound] = {}
        self.high = -1                       # the highest position kept in this sequence
        self._lines = 0                      # lines in the file once the queued writes are done
        self._load()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="opencortex-inbox")
        self._closed = False

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in raw.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue                     # a line torn by a crash: it was never acknowledged
            self._apply(record)
            self._lines += 1

    def _apply(self, record: dict) -> None:
        if "add" in record:
            message = Inbound(**record["add"])
            self._pending[message.position] = message
            self.high = max(self.high, message.position)
        elif "restart" in record:                # a new sequence began at this position
            self._restart(int(record["restart"]))
        elif "floor" in record:                  # a compacted file: floor and done window
            self.floor = max(self.floor, int(record["floor"]))
            self.high = max(self.high, int(record.get("high", self.floor)))
            for position in record.get("done", []):
                self._mark_done(int(position))
        elif "done" in record:
            self._mark_done(int(record["done"]))
        elif "high" in record:                   # the format before the done window
            self.floor = max(self.floor, int(record["high"]))
            self.high = max(self.high, self.floor)

    def _mark_done(self, position: int) -> None:
        self._pending.pop(position, None)
        self._done[position] = None
        while len(self._done) > DONE_WINDOW:
            oldest = next(iter(self._done))
            del self._done[oldest]
            self.floor = max(self.floor, oldest)

    def is_new(self, position: int) -> bool:
        """Whether POSITION was never kept before (pending, done, or under the floor)."""
        return (position > self.floor and position not in self._pending
                and position not in self._done)

    def starts_sequence(self, position: int) -> bool:
        """Whether POSITION can only be the start of a new sequence: under the floor, or
        done but too far under the highest position to be handed out again."""
        if position in self._pending:
            return False
        return position <= self.floor or (position in self._done
                                          and position < self.high - RESTART_GAP)

    def _restart(self, position: int) -> None:
        """Forget the done window of the sequence before POSITION (pending ones stay)."""
        self._done.clear()
        self.floor = -1
        self.high = position

    def _write(self, records: list[dict], *, sync: bool) -> None:
        """Append RECORDS (in the inbox's thread), then fsync with SYNC."""
        data = b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")
                        + b"\n" for r in records)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        if sync:
            os.fsync(self._fd)

    def _queue(self, function, *args, **kwargs) -> Future:
        """FUNCTION run by the inbox's thread after everything queued before it."""
        return self._disk.submit(function, *args, **kwargs)

    def _fresh(self, messages: list[Inbound]) -> tuple[list[Inbound], Future | None]:
        """The MESSAGES not seen before, in position order, and their queued durable write."""
        fresh: dict[int, Inbound] = {}
        records: list[dict] = []
        for message in messages:
            if self.starts_sequence(message.position):
                log.warning("bridge inbox: position %d is under the ones handled before "
                            "(up to %d): a new sequence of update ids; continuing from it",
                            message.position, self.high)
                self._restart(message.position)
                records.append({"restart": message.position})
            if self.is_new(message.position):
                fresh.setdefault(message.position, message)
        ordered = [fresh[p] for p in sorted(fresh)]
        if not ordered:
            return [], None
        self.high = max(self.high, ordered[-1].position)
        records += [{"add": dataclasses.asdict(m)} for m in ordered]
        self._lines += len(records)
        return ordered, self._queue(self._write, records, sync=True)

    def _pend(self, ordered: list[Inbound]) -> list[Inbound]:
        for message in ordered:
            self._pending[message.position] = message
        return ordered

    async def keep(self, messages: list[Inbound]) -> list[Inbound]:
        """Keep MESSAGES not seen before, durably (the fsync waited for off the loop);
        return those, in position order.  OSError when they could not be kept."""
        ordered, written = self._fresh(messages)
        if written is not None:
            await asyncio.wrap_future(written)
        return self._pend(ordered)

    def add(self, messages: list[Inbound]) -> list[Inbound]:
        """`keep`, waiting in the calling thread (not for the event loop)."""
        ordered, written = self._fresh(messages)
        if written is not None:
            written.result()
        return self._pend(ordered)

    def done(self, position: int) -> None:
        """POSITION is handled; it will not be handed out again (the mark is queued;
        after `close` it is not kept, and the message comes back after a restart)."""
        if position not in self._pending or self._closed:
            return
        self._mark_done(position)
        self._lines += 1
        self._queue(self._write, [{"done": position}], sync=False).add_done_callback(_logged)
        if self._lines > COMPACT_AFTER + 2 * len(self._pending):
            self.compact()

    def compact(self) -> None:
        """Have the file rewritten (queued) to the floor, the done window and the
        messages still pending: the text of done messages leaves the disk."""
        if self._closed:
            return
        pending = [{"add": dataclasses.asdict(m)} for m in self.pending()]
        self._lines = 1 + len(pending)
        head = {"floor": self.floor, "high": self.high, "done": list(self._done)}
        self._queue(self._write_compacted, [head, *pending]).add_done_callback(_logged)

    def _sync(self) -> None:
        os.fsync(self._fd)

    def pending(self) -> list[Inbound]:
        """Messages not yet handled, oldest first."""
        return [self._pending[p] for p in sorted(self._pending)]

    def _write_compacted(self, records: list[dict]) -> None:
        """Rewrite the file as RECORDS (in the inbox's thread): the floor and done window,
        then the pending messages."""
        data = b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")
                        + b"\n" for r in records)
        replace_file(self.path, data, temporary=self.path.with_name(self.path.name + ".new"))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def close(self) -> None:
        """Finish the queued writes, with an fsync, then close the file."""
        if self._closed:
            return
        self._closed = True
        self._queue(self._sync).add_done_callback(_logged)
        self._disk.shutdown(wait=True)
        try:
            os.close(self._fd)
        except OSError:
            pass


def _logged(written: Future) -> None:
    """Log a queued write that failed (what failed, never the text)."""
    error = written.exception()
    if error is not None:
        log.error("bridge inbox: a write failed (%s); a message may be handed out again "
                  "after a restart", type(error).__name__)

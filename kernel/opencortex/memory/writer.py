"""The archive's write side: appends written in groups by one thread (group commit).

An append becomes a `Job`: its messages, validated by the caller, with the
moment they were said.  The kernel submits jobs to a `GroupWriter`, whose one
thread takes everything waiting when it is free (at most MAX_BATCH jobs) as
one batch; `Archive._commit` then checks the batch, writes it with
`write_files` and indexes it in one SQLite transaction.  So turns that finish
while a write is in progress share the work: per file ONE `os.write` and ONE
`fsync` (all files of the batch are written first, then synced, which lets
the file system commit its journal once for all of them).  Each submitter
holds a future that resolves only after its own append is durable, or fails
with the reason (the appends of a file whose write or fsync failed fail; the
others of the batch do not).

Each append stays one unit on disk (`:PART: k/N` per thread): appends to the
same file in one batch are laid end to end in one write, so a crash keeps
whole appends and at most one incomplete last one, which is moved aside as
before (see `threadfile.settle_tail`).

What the caller decides before submitting: the messages, their parent links
(an id, None, or "auto": the message before in the append, or for the first
the file's last complete entry) and their time.  What only the writer does:
ids, rendering, bytes to disk, fsync, the index.  A caller applies an
append's records to its own state only once they are durable (`settled`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from opencortex.events import Thread
from opencortex.files import sync_directory, write_all
from opencortex.ids import random_uuid
from opencortex.memory.orgformat import Part, render_entry, render_header
from opencortex.memory.records import MessageRecord, NewMessage
from opencortex.memory.threadfile import ArchiveError, Tails, locked, truncate_quietly

log = logging.getLogger(__name__)

MAX_BATCH = 64          # jobs committed together at most
FILES_AT_ONCE = 64      # files held locked and open together while a batch is written
CLOSE_TIMEOUT = 10.0    # seconds `GroupWriter.close` waits for pending writes
IDLE_EXIT = 30.0        # seconds without work after which the thread ends (the next starts it)
T = TypeVar("T")


class Appended(NamedTuple):
    """What one append stored."""

    records: list[MessageRecord]              # in the order the messages were given
    before: dict[Thread, str | None]          # per thread: the id of the entry before it


class Written(NamedTuple):
    """One file's write of a batch."""

    file: str                                     # path relative to the archive root
    start: int                                    # file size before the write
    end: int                                      # file size after it
    entries: list[tuple[int, MessageRecord]]      # (offset, record) in file order
    mtime: int                                    # its modification time after (ns)


@dataclass(eq=False)
class Job:
    """One append: validated MESSAGES, their IDS (None: a new one) and the time NOW."""

    messages: list[NewMessage]
    ids: list[str | None]
    now: float
    future: Future = field(default_factory=Future)
    records: list[MessageRecord | None] = field(default_factory=list)
    before: dict[Thread, str | None] = field(default_factory=dict)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.records = [None] * len(self.messages)

    def threads(self) -> dict[Thread, list[int]]:
        """Each thread of the append and the positions of its messages, in order."""
        found: dict[Thread, list[int]] = {}
        for position, message in enumerate(self.messages):
            found.setdefault(message.thread, []).append(position)
        return found

    def fail(self, error: BaseException) -> None:
        """Record ERROR as the outcome, unless one was recorded already."""
        if self.error is None:
            self.error = error

    def result(self) -> Appended:
        """The outcome: what was stored, or the error raised."""
        if self.error is not None:
            raise self.error
        if any(record is None for record in self.records):
            raise ArchiveError("an append was left unwritten")     # not expected
        return Appended(list(self.records), dict(self.before))

    def settle(self) -> None:
        """Resolve the future with the outcome (once)."""
        if self.future.done():
            return
        try:
            self.future.set_result(self.result())
        except BaseException as error:      # handed to the submitter
            self.future.set_exception(error)


# -- writing files ----------------------------------------------------------

@dataclass(eq=False)
class _Pending:
    """A file's part of a batch: the jobs writing to it and their positions there."""

    thread: Thread
    path: Path
    name: str
    parts: list[tuple[Job, list[int]]] = field(default_factory=list)
    entries: list[tuple[int, MessageRecord]] = field(default_factory=list)


def plan(jobs: Iterable[Job], path_of: Callable[[Thread], Path],
         name_of: Callable[[Path], str]) -> list[_Pending]:
    """The files JOBS write to, sorted by path (the order locks are taken in)."""
    files: dict[Thread, _Pending] = {}
    for job in jobs:
        for thread, positions in job.threads().items():
            if thread not in files:
                path = path_of(thread)
                files[thread] = _Pending(thread, path, name_of(path))
            files[thread].parts.append((job, positions))
    return sorted(files.values(), key=lambda pending: str(pending.path))


def write_files(files: list[_Pending], tails: Tails) -> list[Written]:
    """Write each file's appends in one write, then fsync each file; what was written.
    TAILS: what each file ended with after the last write (kept up to date).

    The appends of a file that could not be written (or synced) fail with an
    ArchiveError; its write is cut off again."""
    written: list[Written] = []
    for start in range(0, len(files), FILES_AT_ONCE):
        written += _write_group(files[start:start + FILES_AT_ONCE], tails)
    return written


def _write_group(files: list[_Pending], tails: Tails) -> list[Written]:
    """Lock, settle and write FILES, then fsync them, holding every lock to the end."""
    done: list[tuple[_Pending, int, int, int]] = []    # (file, fd, size before, after)
    synced: list[Written] = []
    with ExitStack() as stack:
        for pending in files:
            try:
                fd = _opened(pending.path, stack)
            except OSError as error:     # ArchiveError too: a file that keeps being replaced
                _fail(pending, error)
                continue
            sizes = _write_one(fd, pending, tails)
            if sizes is not None:
                done.append((pending, fd, *sizes))
        for pending, fd, size, end in done:
            try:
                os.fsync(fd)
            except OSError as error:
                truncate_quietly(fd, size)
                tails.forget(pending.path)
                _fail(pending, error)
            else:
                synced.append(Written(pending.name, size, end, pending.entries,
                                      _modified(fd)))
    new = {pending.path.parent for pending, _, size, _ in done if size == 0}
    for directory in sorted(new):
        try:
            sync_directory(directory)
        except OSError as error:
            for pending, *_ in done:
                if pending.path.parent == directory:
                    _fail(pending, error)
    return synced


def _modified(fd: int) -> int:
    """The modification time (ns) of the open file FD (0: unknown)."""
    try:
        return os.fstat(fd).st_mtime_ns
    except OSError:
        return 0


def _opened(path: Path, stack: ExitStack) -> int:
    """PATH locked for writing until STACK closes (created, and its channel directory
    made, when missing: the directory is made only then, not on every write)."""
    try:
        return stack.enter_context(locked(path, exclusive=True, create=True))
    except FileNotFoundError:       # a new channel, or its directory was removed
        path.parent.mkdir(mode=0o700, exist_ok=True)
        return stack.enter_context(locked(path, exclusive=True, create=True))


def _write_one(fd: int, pending: _Pending, tails: Tails) -> tuple[int, int] | None:
    """Settle the tail of PENDING's locked file FD and write its appends in one write;
    the sizes before and after (None when it failed, and its appends failed).  The
    file is locked and opened to append, so nothing else changed its size."""
    try:
        size, last, _ = tails.settle(fd, pending.path, pending.name)
        blob = _render(pending, last, size)
    except (OSError, ValueError) as error:     # ValueError: not expected (validated)
        _fail(pending, error)
        return None
    try:
        write_all(fd, blob)
    except OSError as error:
        truncate_quietly(fd, size)
        tails.forget(pending.path)
        _fail(pending, error)
        return None
    offset, record = pending.entries[-1]        # the last entry (what ends before it: "\n")
    end = size + len(blob)
    tails.wrote(pending.path, end, b"\n" + blob[offset - size:], record.id)
    return size, end


def _render(pending: _Pending, last: str | None, size: int) -> bytes:
    """The bytes of a file's appends (with the header when the file is empty, SIZE 0)
    after the entry LAST; records, ids and `before` are set on the jobs, and each
    record's offset in the file on PENDING."""
    thread = pending.thread
    chunks = [render_header(thread).encode("utf-8")] if size == 0 else []
    offset = size + (len(chunks[0]) if chunks else 0)
    for job, positions in pending.parts:
        job.before[thread] = last
        parent = last
        for number, position in enumerate(positions, start=1):
            message = job.messages[position]
            if message.parent != "auto":
                parent = message.parent
            record = MessageRecord(
                id=job.ids[position] or str(random_uuid()), role=message.role,
                text=message.text, channel=thread.channel, chat_id=thread.chat_id,
                sender=message.sender, parent=parent, turn_type=message.turn_type,
                timestamp=job.now if message.timestamp is None else message.timestamp,
                extra=dict(message.extra))
            chunk = render_entry(record, Part(number, len(positions))).encode("utf-8")
            job.records[position] = record
            pending.entries.append((offset, record))
            chunks.append(chunk)
            offset += len(chunk)
            parent = last = record.id
    return b"".join(chunks)


def _fail(pending: _Pending, error: Exception) -> None:
    """Fail PENDING's appends: its file could not be written."""
    count = sum(len(positions) for _, positions in pending.parts)
    reason = getattr(error, "strerror", None) or error
    failure = ArchiveError(f"could not save {count} message(s) to {pending.name}: {reason}; "
                           "free disk space or fix permissions, then retry")
    failure.__cause__ = error
    for job, _ in pending.parts:
        job.fail(failure)
    log.error("archive write to %s failed: %s", pending.name, type(error).__name__)


# -- the writer thread ------------------------------------------------------

_STOP = object()


class GroupWriter:
    """One thread committing submitted jobs in batches with COMMIT (a list of jobs ->
    None, recording each job's outcome on it); started by a submission, it ends after
    IDLE_EXIT seconds without work (and on `close`)."""

    def __init__(self, commit: Callable[[list[Job]], None], *,
                 name: str = "opencortex-archive-writer", max_batch: int = MAX_BATCH):
        self._commit = commit
        self.name = name
        self.max_batch = max_batch
        self.batches = 0                        # batches committed so far
        self._guard = threading.Lock()
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        """A fresh queue and no thread (also in a child process after fork)."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def submit(self, job: Job) -> Future:
        """Queue JOB; its future resolves once it is durable (or failed)."""
        with self._guard:
            if self._closed:
                raise ArchiveError("the archive is closed; nothing more can be saved")
            if self._pid != os.getpid():
                self._reset()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put(job)
        return job.future

    @property
    def running(self) -> bool:
        """Whether the thread is running."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        """Take what waits, commit it as one batch; until the stop mark or idleness."""
        while True:
            try:
                item = self._queue.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._guard:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if item is _STOP:
                return
            batch, stop = [item], False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._commit_batch(batch)
            if stop:
                return

    def _commit_batch(self, batch: list[Job]) -> None:
        """Commit BATCH and resolve its futures."""
        try:
            self._commit(batch)
        except Exception as error:      # not expected: every job of the batch fails with it
            log.exception("archive writer: a batch failed")
            for job in batch:
                job.fail(ArchiveError(f"the archive could not save this turn "
                                      f"({type(error).__name__}: {error})"))
        self.batches += 1
        for job in batch:
            job.settle()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Write everything submitted, then stop the thread (waiting at most TIMEOUT
        seconds; what is still queued then fails).  False when it did not stop."""
        with self._guard:
            already, self._closed = self._closed, True
            thread = self._thread if self._pid == os.getpid() else None
            if thread is not None and not already:
                self._queue.put(_STOP)
        if thread is None:
            return True
        thread.join(timeout)
        if not thread.is_alive():
            return True
        log.error("archive writer did not finish within %.1f s; failing what waits", timeout)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item.fail(ArchiveError("the archive was closed before this was saved"))
                item.settle()
        self._queue.put(_STOP)        # the thread ends once its write returns
        return False


async def settled(future: Future, then: Callable[[Any], T]) -> T:
    """THEN(the result of FUTURE), awaited to the end.

    When the awaiting task is cancelled meanwhile, the write still lands and
    THEN still runs with it (a caller's state follows the file), and only
    then is the cancellation raised.  (The writer's thread wakes the loop with
    one `call_soon_threadsafe`: every turn waits here.)"""
    loop = asyncio.get_running_loop()
    waiting = [loop.create_future()]     # awaited now (anew when cancelled with the task)
    cancelled = False
    future.add_done_callback(lambda _: _wake(loop, waiting))
    while not future.done():
        try:
            await waiting[0]
        except asyncio.CancelledError:
            cancelled = True
            waiting[0] = loop.create_future()
    if not cancelled:
        return then(future.result())
    if future.exception() is None:
        then(future.result())
    raise asyncio.CancelledError


def _wake(loop: asyncio.AbstractEventLoop, waiting: list[asyncio.Future]) -> None:
    """Have LOOP resolve what WAITING holds then (from the writer's thread)."""
    try:
        loop.call_soon_threadsafe(lambda: waiting[0].done() or waiting[0].set_result(None))
    except RuntimeError:                     # the loop closed: nobody waits any more
        pass

"""The message archive: one org file per thread (the ground truth) plus a SQLite index.

Layout under ROOT (`$OPENCORTEX_HOME/memory`)::

    index.sqlite                    the derived index (rebuilt when missing or unreadable)
    <channel>/<safe chat id>.org    one file per thread; see `orgformat` for its text

Its name and where the chat id is kept: see `layout`.

Writing: all messages of one append go, per thread, into ONE `os.write` on a
file opened with O_APPEND under an exclusive `flock`, followed by `fsync`.
Each entry of that write is marked `:PART: k/N`, so a write (a turn) is one
unit: written whole or not at all.  Before writing, the writer reads the file
backwards only as far as its last write: if that write is incomplete (a crash
mid-write: a torn entry, or fewer than N entries), the whole write is moved to
`<file>.torn-<epoch>` first, and the id of the last complete entry becomes the
PARENT of the new messages.  Readers never see an incomplete write (see
`completeness`).  So the cost of an append does not grow with the size of
memory, and two processes appending to the same file stay safe.  Readers take
a shared `flock`.  The kernel does not write on its event loop: it submits
appends to one writer thread, which commits the appends that wait together
(one write and one fsync per file, one index transaction; see `writer`);
with `[memory] write_process = true`, `opencortex serve` has that thread's files
written by a child process (`write_in_a_process`, see `write_process`), and it
indexes what the child answers.

The index remembers how many bytes of each file it has seen, and the file's
modification time then; on open it reads only what grew since (and reads again
a file changed otherwise, see `reread`, a file of the same size whose time moved
on among them), and a file of the size and time it has seen is not even opened
(a stat tells).  Searches read through a connection of their
own, so they do not wait for the writer's files and fsyncs.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from opencortex.events import Thread
from opencortex.memory.archive_queries import ArchiveQueries, check_limit
from opencortex.memory.index import MessageIndex
from opencortex.memory.layout import ThreadFiles, ThreadHeaders
from opencortex.memory.partitions import DEFAULT_TOKENIZER, Partition
from opencortex.memory.readers import Readers, searching
from opencortex.memory.completeness import parse_thread_file
from opencortex.memory.records import MessageRecord, NewMessage, check_thread
from opencortex.memory.threadfile import ArchiveError, Tails, locked, read_range
from opencortex.memory.upkeep import BackgroundCatchUp, IndexUpkeep
from opencortex.memory.writer import Appended, GroupWriter, Job, plan, write_files

if TYPE_CHECKING:
    from opencortex.memory.write_process import WriteProcess

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite"
MESSAGE_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}")   # an id given to `append`


class Archive(ArchiveQueries, IndexUpkeep):
    """Remembered messages: org files per thread plus a SQLite FTS5 index (searched
    as `ArchiveQueries` says, kept in step with the files as `IndexUpkeep` says)."""

    def __init__(self, root: Path, *, read_only: bool = False,
                 tokenizer: str = DEFAULT_TOKENIZER, background: bool = False):
        """Open the archive at ROOT (created when missing), repairing torn writes.

        READ_ONLY (a home that cannot be written): nothing is created or repaired,
        the index is built in memory from the org files, and `append` refuses.
        TOKENIZER: "porter" (English stemming, the default), "unicode61"
        (words as written) or "snowball-LANGUAGE" (a Snowball stemmer's, see
        `stems`); an index made with another one is rebuilt.
        BACKGROUND (a long-lived kernel): much to index (a lost index, a new
        layout) is indexed by a thread while the archive is used (see `upkeep`).
        """
        self.root = Path(root)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._writer = GroupWriter(self._commit)
        self._tails = Tails()                        # what each file ended with (writer)
        self._files = ThreadFiles(self.root)         # where each thread is kept
        self._headers = ThreadHeaders(self.root)     # the thread each file holds
        self._readers: Readers | None = None         # the connections searches read through
        self._write_process: WriteProcess | None = None   # see `write_in_a_process`
        self.files_made = 0          # thread files this archive created (recall looks again)
        self._catching_up: BackgroundCatchUp | None = None
        if read_only:
            self._index = MessageIndex(Path(":memory:"), tokenizer=tokenizer)
            self._catch_up()
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index = MessageIndex(self.root / INDEX_NAME, tokenizer=tokenizer)
        self._readers = Readers(self.root / INDEX_NAME, tokenizer,
                                lambda: self._index.generation)
        _, stats = self._settle_tails()
        self._catch_up(background=background, stats=stats)

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Write what was submitted (waiting a bounded time), stop the writer thread, and
        close the index (the org files are closed after every operation)."""
        self._stop_catching_up()
        stopped = self._writer.close()
        if self._write_process is not None and stopped:
            self._write_process.close()
        if self._readers is not None:
            self._readers.close()
        if stopped:       # else a write still hangs (a stuck disk): it keeps the index
            with self._lock:
                self._index.close()

    @property
    def lock(self) -> threading.RLock:
        """Held while files and index change together (`retention` holds it too)."""
        return self._lock

    @property
    def partition(self) -> Partition:
        """Whose each thread is, as search ranks it (see `set_partition`)."""
        return self._index.partition

    def set_partition(self, partition: Partition) -> int:
        """Rank search per owner as PARTITION (thread -> owner name) says: each owner's
        messages are scored with that owner's word statistics.  Threads indexed
        under another owner are moved; returns how many.  Scope is unaffected."""
        with self._lock:
            return self._index.set_partition(partition)

    # -- files -------------------------------------------------------------

    def thread_file(self, thread: Thread) -> Path:
        """The org file holding THREAD's messages."""
        return self._files.path(thread)

    def _name(self, path: Path) -> str:
        return self._files.name(path)

    def threads(self) -> list[Thread]:
        """Every thread with a file in the archive, sorted (a file's header read once)."""
        return self._headers.threads()

    # -- writing -----------------------------------------------------------

    def append(self, messages: Sequence[NewMessage], *,
               ids: Sequence[str] | None = None) -> list[MessageRecord]:
        """Store MESSAGES (one turn) and return their records, in the given order.

        Per thread: one locked, fsynced write, made in the calling thread (imports,
        the CLI; the kernel, on its loop, uses `submit`).  A message's PARENT is, by
        default ("auto"), the message
        before it in the batch, or for the first one the last complete entry of the
        file; an explicit id must name a message already in the same thread
        (ValueError otherwise, and nothing is written).

        Every message is validated again first, so one that cannot be stored
        (text with an unpaired surrogate, say, in a message built without
        validation) raises ValueError before anything is written.

        IDS (imports, see `importer`): each message's id instead of a new random
        one; ids must be distinct and not yet in the archive (ValueError otherwise).
        """
        return self.write(messages, ids=ids).records

    def write(self, messages: Sequence[NewMessage], *,
              ids: Sequence[str] | None = None) -> Appended:
        """`append`, also telling per thread which entry the write follows."""
        job = self._job(messages, ids)
        self._commit([job])
        return job.result()

    def submit(self, messages: Sequence[NewMessage], *,
               ids: Sequence[str] | None = None) -> Future:
        """`write` done by the writer thread, in a group commit with the appends submitted
        meanwhile: a future that resolves to the `Appended` once it is durable (written,
        fsynced, indexed), or fails with ArchiveError or ValueError.  Invalid messages
        raise at once."""
        return self._writer.submit(self._job(messages, ids))

    def write_in_a_process(self, **settings: float) -> None:
        """Have the writer thread's files written by a child process from now on (see
        `write_process`; SETTINGS: its timeouts), started now; serve does this when
        `[memory] write_process` is on."""
        if self.read_only or self._write_process is not None:
            return
        from opencortex.memory.write_process import WriteProcess
        self._write_process = WriteProcess(**settings)
        self._write_process.start()

    def writes_report(self) -> str:
        """Where the archive's files are written, in words (doctor, `/metrics`)."""
        if self._write_process is None:
            return "in the writer thread"
        return self._write_process.report()

    @property
    def batches(self) -> int:
        """How many group commits the writer thread made (for tests and benchmarks)."""
        return self._writer.batches

    def _job(self, messages: Sequence[NewMessage], ids: Sequence[str] | None) -> Job:
        """MESSAGES validated as one append (ValueError, or ArchiveError when read-only)."""
        if self.read_only:
            raise ArchiveError(f"the archive at {self.root} is open read-only; nothing "
                               "can be saved (make the home writable, or use another --home)")
        batch = [NewMessage.model_validate(m) for m in messages]
        if ids is not None and (len(ids) != len(batch) or len(set(ids)) != len(ids) or not all(
                isinstance(id_, str) and MESSAGE_ID.fullmatch(id_) for id_ in ids)):
            raise ValueError(f"ids must be {len(batch)} distinct ids, one per message, each "
                             "1-128 letters, digits, '.', '_' or '-'")
        return Job(batch, list(ids) if ids is not None else [None] * len(batch), time.time())

    def _commit(self, jobs: list[Job]) -> None:
        """Check, write and index JOBS together (see `writer`); each gets its outcome."""
        with self._lock:
            claimed: dict[str, Thread] = {}      # ids written by earlier jobs of the batch
            ready = [job for job in jobs if self._checked(job, claimed)]
            files = plan(ready, self.thread_file, self._name)
            written = write_files(files, self._tails) if self._write_process is None else \
                self._write_process.write(files, self._tails)
            if not written:
                return
            self.files_made += sum(1 for w in written if w.start == 0)
            try:
                self._index.add_writes((w.file, w.start, w.end, w.entries, w.mtime)
                                       for w in written)
            except sqlite3.Error as error:     # the files hold it: the next catch-up indexes it
                log.error("could not index %d write(s) (%s); they are indexed when the files "
                          "are next read", len(written), type(error).__name__)

    def _checked(self, job: Job, claimed: dict[str, Thread]) -> bool:
        """Whether JOB's ids and explicit parents are acceptable (it fails otherwise)."""
        try:
            given = [id_ for id_ in job.ids if id_ is not None]
            if known := self.known_ids(given) | (set(given) & claimed.keys()):
                raise ValueError(f"{len(known)} of the ids are already in the archive")
            for message in job.messages:       # an explicit parent must be of its thread
                if message.parent is not None and message.parent != "auto" and \
                        claimed.get(message.parent) != message.thread and \
                        self._tails.last_id(self.thread_file(message.thread)) != message.parent:
                    self._check_parent(message.thread, message.parent)
        except ValueError as error:
            job.fail(error)
            return False
        claimed.update((id_, message.thread) for id_, message in zip(job.ids, job.messages)
                       if id_ is not None)
        return True

    def known_ids(self, ids: Iterable[str]) -> set[str]:
        """Which of IDS name messages already in the archive (looked up in the index)."""
        with self._lock:
            return {id_ for id_ in ids if self._index.thread_of(id_) is not None}

    def platform_ids(self, thread: Thread) -> set[str]:
        """The platform's message ids (PLATFORM_ID) of THREAD's archived messages."""
        with self._lock:
            return {str(value) for value in self._index.platform_ids(Thread(*thread))}

    def _check_parent(self, thread: Thread, parent: str) -> None:
        """Refuse an explicit PARENT that is not a message of THREAD (looked up in the index)."""
        found = self._index.thread_of(parent)
        if found is None:       # another process may have appended it: catch up, then look again
            path = self.thread_file(thread)
            if path.exists():
                self._catch_up_file(path)
                found = self._index.thread_of(parent)
        if found != thread:
            where = "is not in the archive" if found is None else "belongs to another thread"
            raise ValueError(f"parent {parent!r} {where}; a message's parent must be an "
                             f"earlier message of the same thread ({thread})")

    # -- reading -----------------------------------------------------------

    def history(self, thread: Thread, limit: int = 20) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first (from the index)."""
        thread = check_thread(thread)
        limit = check_limit(limit)
        with self._lock:
            return self._index.history(thread, limit) if limit else []

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """Every message of THREAD in file order, from the index (fast; the index is
        brought up to date with the org file first, which stays the ground truth)."""
        thread = check_thread(thread)
        path = self.thread_file(thread)
        with self._lock:
            if path.exists():
                self._catch_up_file(path)
            return self._index.thread_records(thread)

    def records_before(self, thread: Thread, before: int | None, limit: int
                       ) -> list[tuple[int, MessageRecord]]:
        """(offset in its file, record) of the LIMIT messages of THREAD just before file
        offset BEFORE, newest first: a thread paged through from its end, never held
        whole.  BEFORE None starts at the end, the index first brought up to date."""
        thread = check_thread(thread)
        path = self.thread_file(thread)
        with self._lock:
            if before is None and path.exists():
                self._catch_up_file(path)
            return self._index.records_before(thread, before, check_limit(limit))

    def first_message_id(self, thread: Thread) -> str | None:
        """The id of THREAD's first conversation message, control records aside (None:
        it has none), from the index."""
        with self._lock:
            return self._index.first_message_id(check_thread(thread))

    def bridged_span(self, thread: Thread) -> tuple[float, float, frozenset[str]] | None:
        """(first, last time, the senders of its people's messages) of what a bridge
        archived of THREAD (None: nothing)."""
        thread = check_thread(thread)
        with self._lock:
            return self._index.bridged_span(thread)

    def bridged_between(self, thread: Thread, start: float, end: float,
                        roles: tuple[str, ...], sender: str | None = None, *,
                        platform_ids: bool = True) -> list[tuple[str, str, str, float]]:
        """(id, role, text, time) of what a bridge archived of THREAD between START and
        END, by ROLES (and SENDER); see `MessageIndex.said_between`."""
        with self._lock:
            return self._index.said_between(check_thread(thread), start, end, roles, sender,
                                            platform_ids=platform_ids)

    def _reading(self) -> AbstractContextManager[MessageIndex]:
        """The index a search reads (see `readers.searching`)."""
        return searching(self._index, self._lock, self._readers)

    def read_thread(self, thread: Thread) -> list[MessageRecord]:
        """Every complete message of THREAD, parsed from its org file with orgparse."""
        thread = check_thread(thread)
        path = self.thread_file(thread)
        if not path.exists():
            return []
        with locked(path, exclusive=False) as fd:
            data = read_range(fd, 0, os.fstat(fd).st_size)
        parsed = parse_thread_file(data)
        if parsed.skipped:
            log.warning("%s: skipped %d malformed entries", self._name(path), parsed.skipped)
        if parsed.length < len(data):
            log.warning("%s ends with an incomplete write of %d bytes; "
                        "Archive.repair() moves it aside", self._name(path),
                        len(data) - parsed.length)
        return [record for _, record in parsed.entries if record.thread == thread]

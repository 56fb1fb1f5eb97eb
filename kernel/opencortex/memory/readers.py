"""The connections searches read the index through: one per thread that searches.

The kernel searches (recall) in worker threads.  Each gets a read-only
connection of its own to the index: in WAL mode readers see the last commit
and neither wait for the writer thread (which holds the archive's lock while
it writes and fsyncs files) nor for each other, and SQLite runs their queries
without holding Python's GIL.  A connection keeps caches of table names and
very common words; when the writing connection drops, empties or moves tables
(its `generation` moves on), the caches are dropped before the next read.
A thread's connection is closed once the thread ended (checked when another
thread opens one).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from opencortex.memory.index import MessageIndex


@dataclass(eq=False)
class _Reader:
    index: MessageIndex
    seen: int = -1                                   # the writer's generation last read at
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread = field(default_factory=threading.current_thread)


class Readers:
    """Read-only connections to the index at PATH, one per thread, opened on first use."""

    def __init__(self, path: Path, tokenizer: str, generation: Callable[[], int]):
        """GENERATION: the writing connection's `MessageIndex.generation`."""
        self.path = path
        self.tokenizer = tokenizer
        self._generation = generation
        self._local = threading.local()
        self._all: list[_Reader] = []
        self._guard = threading.Lock()
        self._closed = False

    @contextmanager
    def reading(self) -> Iterator[MessageIndex]:
        """This thread's reading connection, its caches current."""
        reader = getattr(self._local, "reader", None)
        if reader is None:
            with self._guard:
                if self._closed:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
                self._close_ended()
                reader = _Reader(MessageIndex(self.path, tokenizer=self.tokenizer, reader=True))
                self._all.append(reader)
            self._local.reader = reader
        with reader.lock:
            generation = self._generation()
            if generation != reader.seen:          # tables were dropped, emptied or moved
                reader.index.forget_caches()
                reader.seen = generation
            yield reader.index

    def _close_ended(self) -> None:
        """Close the connections of threads that ended (with the guard held): a pool
        that gave up a task is replaced by new threads, each opening its own, and the
        old ones end once their tasks do."""
        ended = [reader for reader in self._all if not reader.thread.is_alive()]
        if ended:
            self._all = [reader for reader in self._all if reader.thread.is_alive()]
            for reader in ended:
                reader.index.close()

    def open_connections(self) -> int:
        """How many reading connections are open."""
        with self._guard:
            return len(self._all)

    def close(self) -> None:
        """Close every connection (each once its current read ended)."""
        with self._guard:
            self._closed = True
            readers, self._all = self._all, []
        for reader in readers:
            with reader.lock:
                reader.index.close()


@contextmanager
def searching(writing: MessageIndex, lock: threading.RLock,
              readers: Readers | None) -> Iterator[MessageIndex]:
    """The index a search reads: WRITING's connection when nobody holds LOCK (its page
    cache holds what was just written, which every other connection reads again after
    each write), else this thread's own from READERS, which waits neither for the
    writer nor for other readers (WAL); without READERS (an in-memory index), WRITING
    under LOCK.  A search holding the writing connection is bounded in time (see
    `ranking`), and the writer waits for it at most that long."""
    if readers is None:
        with lock:
            yield writing
    elif lock.acquire(blocking=False):
        try:
            yield writing
        finally:
            lock.release()
    else:
        with readers.reading() as index:
            yield index

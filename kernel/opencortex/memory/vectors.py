"""Message vectors for dense recall, in their own SQLite file beside the index.

`HOME/memory/vectors.sqlite` is derived data, like the index, and can be
deleted at any time (vectors are made again on later recalls).  It is only
ever created when an embedding model is configured.  Tables:

- `vectors (id, channel, chat_id, epoch, vec)`: one unit-length float32 vector
  per message id (a blob of 4 bytes per dimension), with the message's thread;
- `progress (channel, chat_id, seq, id, size)`: per thread, the index row up to
  which every message has a vector (`seq`, checked against its `id`: a rebuilt
  index renumbers rows) and the indexed size of the thread's file when that
  was last true (`size`: an unchanged thread is skipped without a scan);
- `meta`: the model the vectors came from and their dimensions; another model
  empties the file.

Messages are read from the archive's index (`index.sqlite`), attached
read-only, so the archive's write path is untouched.  Filling is lazy and
bounded: `pending` finds at most BATCH messages of the given threads without a
vector (newest first), `commit` stores them once embedded.  `search` is a
brute-force dot product over the threads' vectors, kept in memory once read
(4 bytes x dimensions per message; see `nearest`).  Only the newest
`max_vectors` of one search are scored; beyond that a warning says so.

Vectors of forgotten messages are deleted when their thread is next filled
(a rewritten file invalidates its progress mark), when a search finds them
gone from the index, and on open for threads the index no longer has.
"""

from __future__ import annotations

import heapq
import logging
import sqlite3
import threading
from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencortex.events import Thread
from opencortex.memory.archive import INDEX_NAME, Archive
from opencortex.memory.nearest import VectorBlock, nearest
from opencortex.memory.rows import COLUMNS, is_control, record_fields
from opencortex.memory.records import MessageRecord

log = logging.getLogger(__name__)

VECTORS_NAME = "vectors.sqlite"
NOT_CONTROL = "json_extract(m.extra, '$.CONTROL') IS NULL"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS vectors (id TEXT PRIMARY KEY, channel TEXT NOT NULL,
    chat_id TEXT NOT NULL, epoch REAL NOT NULL, vec BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS vectors_in_thread ON vectors (channel, chat_id);
CREATE TABLE IF NOT EXISTS progress (channel TEXT NOT NULL, chat_id TEXT NOT NULL,
    seq INTEGER NOT NULL, id TEXT, size INTEGER, PRIMARY KEY (channel, chat_id));
"""


class VectorStoreError(RuntimeError):
    """The vectors file or the index could not be used."""


@dataclass
class Pending:
    """Messages without a vector, and each thread's progress once they have one."""

    rows: list[tuple[Thread, str, str, float]] = field(default_factory=list)  # thread, id, text, epoch
    marks: dict[Thread, tuple[int, str | None, int | None]] = field(default_factory=dict)


class VectorStore:
    """The vectors of one archive's messages, made by the model named MODEL."""

    def __init__(self, archive: Archive, model: str, *, max_vectors: int = 200_000):
        """Nothing is opened or created until the first use."""
        self.archive = archive
        self.model = model
        self.max_vectors = max_vectors
        self.path = archive.root / VECTORS_NAME
        self._db: sqlite3.Connection | None = None
        self._dimensions: int | None = None
        self._blocks: dict[Thread, VectorBlock] = {}
        self._warned: set[frozenset[Thread]] = set()
        self._lock = threading.RLock()

    # -- the file ------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The vectors file with the index attached read-only (opened on first use)."""
        if self._db is None:
            index = self.archive.root / INDEX_NAME
            if self.archive.read_only or not index.is_file():
                raise VectorStoreError("the archive has no index file to read messages from")
            try:
                self._db = self._open(index)
            except sqlite3.Error as error:
                raise VectorStoreError(f"{self.path}: {error}") from error
            self._prune_gone_threads()
        return self._db

    def _open(self, index: Path) -> sqlite3.Connection:
        db = sqlite3.connect(self.path.as_uri(), uri=True, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode = WAL")    # no journal file made per write
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(_SCHEMA)
            db.execute("ATTACH DATABASE ? AS idx", (index.as_uri() + "?mode=ro",))
            meta = dict(db.execute("SELECT key, value FROM meta"))
            if meta.get("model") != self.model:
                if meta.get("model"):
                    log.info("vectors were made by another model; starting again")
                self._clear(db)
            elif meta.get("dimensions"):
                self._dimensions = int(meta["dimensions"])
        except BaseException:
            db.close()
            raise
        return db

    def _clear(self, db: sqlite3.Connection) -> None:
        """Forget every vector (another model or other dimensions)."""
        with _transaction(db):
            db.execute("DELETE FROM vectors")
            db.execute("DELETE FROM progress")
            db.execute("DELETE FROM meta")
            db.execute("INSERT INTO meta (key, value) VALUES ('model', ?)", (self.model,))
        self._dimensions = None
        self._blocks.clear()

    def _prune_gone_threads(self) -> None:
        """Delete the vectors of threads the index holds no message of any more."""
        db = self._db
        threads = db.execute("SELECT DISTINCT channel, chat_id FROM vectors").fetchall()
        gone = [t for t in threads if db.execute(
            "SELECT 1 FROM idx.messages WHERE channel = ? AND chat_id = ? LIMIT 1",
            t).fetchone() is None]
        if gone:
            with _transaction(db):
                for thread in gone:
                    db.execute("DELETE FROM vectors WHERE channel = ? AND chat_id = ?", thread)
                    db.execute("DELETE FROM progress WHERE channel = ? AND chat_id = ?", thread)
            log.info("vectors: %d forgotten thread(s) pruned", len(gone))

    def close(self) -> None:
        """Close the file (it is opened again by the next use)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._blocks.clear()

    def count(self) -> int:
        """How many vectors are stored."""
        with self._lock:
            return self._connection().execute("SELECT count(*) FROM vectors").fetchone()[0]

    # -- filling -------------------------------------------------------------

    def pending(self, threads: Sequence[Thread], batch: int) -> Pending:
        """At most BATCH messages of THREADS without a vector (each thread's newest first)."""
        with self._lock:
            db = self._connection()
            found = Pending()
            for thread in threads:
                if len(found.rows) >= batch:
                    break
                self._pending_in(db, Thread(*thread), batch - len(found.rows), found)
            return found

    def _pending_in(self, db: sqlite3.Connection, thread: Thread, wanted: int,
                    found: Pending) -> None:
        """Add THREAD's messages without a vector (up to WANTED) to FOUND."""
        name = self.archive.thread_file(thread).relative_to(self.archive.root).as_posix()
        mark = db.execute("SELECT seq, id, size FROM progress WHERE channel = ? AND "
                          "chat_id = ?", thread).fetchone()
        with _transaction(db):       # one snapshot of the index
            size = _one(db, "SELECT size FROM idx.files WHERE path = ?", (name,))
            if mark is not None and size is not None and mark[2] == size:
                return                                    # nothing indexed since
            after = mark[0] if mark is not None and self._still_there(db, mark) else 0
            if mark is not None and after == 0 and mark[1] is not None:
                self._prune_thread(db, thread)           # the file was rewritten
            rows = db.execute(
                "SELECT m.id, m.text, m.epoch FROM idx.messages m WHERE m.channel = ? AND "
                "m.chat_id = ? AND m.seq > ? AND NOT EXISTS (SELECT 1 FROM vectors v "
                f"WHERE v.id = m.id) AND {NOT_CONTROL} ORDER BY m.seq DESC LIMIT ?",
                (*thread, after, wanted)).fetchall()
            found.rows += [(thread, id_, text, epoch) for id_, text, epoch in rows]
            if len(rows) < wanted:                        # all of the thread once these are in
                last = db.execute(      # the file's last message (a lower mark is only slower)
                    "SELECT seq, id FROM idx.messages WHERE channel = ? AND chat_id = ? "
                    "ORDER BY offset DESC LIMIT 1", thread).fetchone()
                found.marks[thread] = (*(last or (0, None)), size)

    @staticmethod
    def _still_there(db: sqlite3.Connection, mark: tuple) -> bool:
        """True when the progress MARK's row still holds the same message."""
        seq, id_, _ = mark
        return id_ is None or _one(db, "SELECT id FROM idx.messages WHERE seq = ?",
                                   (seq,)) == id_

    def _prune_thread(self, db: sqlite3.Connection, thread: Thread) -> None:
        """Delete THREAD's vectors whose message the index no longer has."""
        gone = db.execute(
            "DELETE FROM vectors WHERE channel = ? AND chat_id = ? AND id NOT IN "
            "(SELECT id FROM idx.messages WHERE channel = ? AND chat_id = ?)",
            (*thread, *thread)).rowcount
        db.execute("DELETE FROM progress WHERE channel = ? AND chat_id = ?", thread)
        self._blocks.pop(thread, None)
        if gone:
            log.info("vectors: %d of a rewritten thread's pruned", gone)

    def commit(self, pending: Pending, vectors: Sequence[array]) -> None:
        """Store the VECTORS of PENDING's messages (in order) and its progress marks."""
        if len(vectors) != len(pending.rows):
            raise ValueError(f"{len(vectors)} vectors for {len(pending.rows)} messages")
        with self._lock:
            db = self._connection()
            if vectors and len(vectors[0]) != self._dimensions:
                self._set_dimensions(db, len(vectors[0]))
            with _transaction(db):
                db.executemany(
                    "INSERT OR REPLACE INTO vectors (id, channel, chat_id, epoch, vec) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(id_, *thread, epoch, vector.tobytes())
                     for (thread, id_, _, epoch), vector in zip(pending.rows, vectors)])
                db.executemany("INSERT OR REPLACE INTO progress (channel, chat_id, seq, id, "
                               "size) VALUES (?, ?, ?, ?, ?)",
                               [(*thread, *mark) for thread, mark in pending.marks.items()])
            for (thread, id_, _, epoch), vector in zip(pending.rows, vectors):
                block = self._blocks.get(thread)
                if block is not None:
                    block.add(id_, epoch, vector.tobytes())

    def _set_dimensions(self, db: sqlite3.Connection, dimensions: int) -> None:
        """Record DIMENSIONS; vectors of other dimensions (a replaced model) are dropped."""
        if self._dimensions is not None:
            log.warning("the embedding model now gives %d dimensions, not %d; its vectors "
                        "are made again", dimensions, self._dimensions)
            self._clear(db)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('dimensions', ?)",
                   (str(dimensions),))
        self._dimensions = dimensions

    # -- searching -----------------------------------------------------------

    def search(self, threads: Collection[Thread], query: array, limit: int, *,
               exclude_ids: Collection[str] = (),
               window: tuple[float, float] | None = None) -> list[tuple[str, float]]:
        """(id, cosine) of the LIMIT vectors of THREADS nearest QUERY, best first; with
        WINDOW, those said within it come first."""
        with self._lock:
            db = self._connection()
            if self._dimensions is None or len(query) != self._dimensions or limit <= 0:
                return []
            blocks = [self._block(db, Thread(*t)) for t in sorted(threads)]
            since = self._cutoff(blocks, frozenset(threads))
            return nearest(blocks, query, limit, since=since, exclude=set(exclude_ids),
                           window=window)

    def _block(self, db: sqlite3.Connection, thread: Thread) -> VectorBlock:
        """THREAD's vectors in memory (read from the file the first time)."""
        block = self._blocks.get(thread)
        if block is None:
            block = VectorBlock()
            for id_, epoch, blob in db.execute(
                    "SELECT id, epoch, vec FROM vectors WHERE channel = ? AND chat_id = ?",
                    thread):
                if len(blob) == 4 * self._dimensions:
                    block.add(id_, epoch, blob)
            self._blocks[thread] = block
        return block

    def _cutoff(self, blocks: list[VectorBlock], scope: frozenset[Thread]) -> float:
        """The oldest epoch searched: beyond max_vectors, only the newest are."""
        total = sum(len(block.ids) for block in blocks)
        if total <= self.max_vectors:
            return float("-inf")
        if scope not in self._warned:
            self._warned.add(scope)
            log.warning("dense recall: %d vectors in scope, over max_vectors = %d; only "
                        "the newest %d are searched (raise [memory.embeddings] max_vectors "
                        "to search more, at 4 bytes x dimensions of memory each)",
                        total, self.max_vectors, self.max_vectors)
        epochs = [epoch for block in blocks for epoch in block.epochs]
        return heapq.nlargest(self.max_vectors, epochs)[-1]

    def records(self, ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The indexed messages with these IDS; vectors of ids gone from the index are
        deleted (forgotten messages)."""
        with self._lock:
            db = self._connection()
            if not ids:
                return {}
            marks = ", ".join("?" * len(ids))
            rows = db.execute(f"SELECT {COLUMNS} FROM idx.messages WHERE id IN ({marks})",
                              list(ids)).fetchall()
            found = {}
            for row in rows:
                record = record_fields(row)
                if not is_control(record["extra"]):
                    found[record["id"]] = MessageRecord(**record)
            gone = [id_ for id_ in ids if id_ not in found]
            if gone:
                with _transaction(db):
                    db.executemany("DELETE FROM vectors WHERE id = ?", [(i,) for i in gone])
                self._blocks.clear()
                log.info("vectors: %d of forgotten messages deleted", len(gone))
            return found


class _transaction:
    """BEGIN (deferred: the read-only index is never locked for writing) ... COMMIT."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.mine = not db.in_transaction

    def __enter__(self) -> sqlite3.Connection:
        if self.mine:
            self.db.execute("BEGIN")
        return self.db

    def __exit__(self, kind: Any, *_: Any) -> None:
        if self.mine:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _one(db: sqlite3.Connection, sql: str, values: tuple) -> Any:
    """The first column of the first row of SQL, or None."""
    row = db.execute(sql, values).fetchone()
    return None if row is None else row[0]

"""The SQLite index over the org archive: recent history and FTS5 search.

The org files are the ground truth; this index is derived from them and can be
dropped and rebuilt at any time.  Tables:

- `messages`: one row per message with its file and byte offset (the order of
  a thread is the order of its file);
- `fts_N`: an FTS5 table per partition (an owner, or a few sharing one: see
  `partitions`) over the message text, with the thread as a single opaque
  token in its own column so `thread:(A OR B) AND text:(...)` narrows fast,
  the sender in a third (a filter too: what a named person said), and the
  terms kept beside the text in a fourth (its Chinese and Japanese terms, see
  `cjk`, and with a Snowball stemmer its words' stems, see `stems`; the column
  is named `cjk`, as it was made before stems).  Control records (a
  branch/head/pin note, marked by a CONTROL extra property) are kept in
  `messages` but never put in an FTS table: search cannot return them;
- `files`: for each org file, how many of its bytes are known to be indexed;
- `meta`: the tokenizer the FTS tables were made with ("porter" stems English
  words, so "donated" finds "donate"; "snowball-LANGUAGE" another language's), and
  how far each re-read of a changed file is (see `reread`).

Ranked search (`ranking.RankedSearch`), a changed file read again
(`reread.IndexRereads`) and a thread read a piece at a time
(`timeline.ThreadTimeline`) are parts of `MessageIndex`; rows are records as `rows` says.

An index of another schema version or tokenizer is rebuilt on open (one of
layout 4 with few owners is upgraded in place).  The SQLite file is opened
lazily, by the first read or write (a kernel starts without touching it until
its archive needs it).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from opencortex.events import Thread
from opencortex.memory.partitions import (DEFAULT_TOKENIZER, PARTS_INDEXES, PARTS_TABLE,
                                          Partition, Partitions, fts_tables, thread_token,
                                          upgrade_from_4)
from opencortex.memory.ranking import RankedSearch
from opencortex.memory.records import MessageRecord
from opencortex.memory.reread import KEY as REREAD_KEY, IndexRereads
from opencortex.memory.rows import (AFTER_EACH, BEFORE_EACH, COLUMNS, UNDELIVERED,
                                   is_control, record_fields, row_values, who)
from opencortex.memory.timeline import TIME_INDEX_SQL, ThreadTimeline

log = logging.getLogger(__name__)

SCHEMA_VERSION = 6
_SCHEMA = f"""
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL, text TEXT NOT NULL, channel TEXT NOT NULL, chat_id TEXT NOT NULL,
    sender TEXT, epoch REAL NOT NULL, parent TEXT, turn_type TEXT NOT NULL,
    extra TEXT NOT NULL, file TEXT NOT NULL, offset INTEGER NOT NULL);
CREATE INDEX messages_in_thread ON messages (channel, chat_id, offset);
CREATE INDEX messages_in_file ON messages (file);
{TIME_INDEX_SQL};
CREATE TABLE files (path TEXT PRIMARY KEY, size INTEGER NOT NULL,
                    mtime INTEGER NOT NULL DEFAULT 0);
{PARTS_TABLE};
CREATE TABLE thread_parts (channel TEXT NOT NULL, chat_id TEXT NOT NULL, part TEXT NOT NULL,
                           PRIMARY KEY (channel, chat_id));
CREATE TABLE senders (tab INTEGER NOT NULL, sender TEXT NOT NULL, PRIMARY KEY (tab, sender))
    WITHOUT ROWID;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_TABLES = ("messages", "files", "parts", "thread_parts", "senders", "meta")


class MessageIndex(RankedSearch, IndexRereads, ThreadTimeline):
    """History and search over the archive, stored in one SQLite file (WAL mode)."""

    def __init__(self, path: Path, *, tokenizer: str = DEFAULT_TOKENIZER,
                 reader: bool = False):
        """The index at PATH, opened by its first use (see `_db`).

        TOKENIZER: "porter" (English stemming), "unicode61" or "snowball-LANGUAGE"
        (see `stems`); an index made
        with another one is emptied.  The archive then fills an empty index
        from the org files.  A READER connection only reads an index another
        connection made (it never creates, empties or deletes it).
        """
        self.path = Path(path)
        self.reader = reader
        self.generation = 0      # moves on when tables are dropped, emptied or moved
        self._counts: dict[tuple[str, str], tuple[int, int]] = {}   # see RankedSearch
        self._rare: dict[tuple[str, str], int] = {}     # rarer words' counts, see RankedSearch
        self._rare_state: tuple[int, int] | None = None
        self._sizes: dict[str, tuple[int, float]] = {}  # table -> (messages, when counted)
        self._partitions = Partitions(tokenizer)      # attached to the connection on open
        self._connection: sqlite3.Connection | None = None
        self._opening = threading.Lock()
        self._closed = False
        self._moved = False      # a write moved an owner's messages (see `_write`)

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened on first use (an unreadable index is deleted and
        created anew, empty).  After `close`, sqlite3.ProgrammingError."""
        with self._opening:
            if self._connection is None and not self._closed:
                try:
                    db = self._open()
                except sqlite3.DatabaseError as error:
                    if self.reader:
                        raise
                    log.warning("index %s is unreadable (%s); rebuilding it", self.path,
                                type(error).__name__)
                    self._remove_files()
                    db = self._open()
                self._partitions.attach(db)
                self._connection = db
        if self._connection is None:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        return self._connection

    @property
    def _parts(self) -> Partitions:
        """The partitions, working on the connection (opened on first use)."""
        self._db
        return self._partitions

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if self.reader:
            db.execute("PRAGMA query_only = ON")
            return db
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                if version:
                    log.info("index %s is of layout %d, not %d; it is rebuilt from the org "
                             "files (once)", self.path, version, SCHEMA_VERSION)
                self._create(db)
            elif self._tokenizer(db) != self._partitions.tokenizer:
                log.info("index %s was made with another tokenizer; rebuilding it", self.path)
                self._create(db, force=True)
            db.execute("SELECT count(*) FROM files").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    @staticmethod
    def _tokenizer(db: sqlite3.Connection) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = 'tokenizer'").fetchone()
        return None if row is None else row[0]

    def _create(self, db: sqlite3.Connection, *, force: bool = False) -> None:
        """(Re)create the schema, unless another process just did (or FORCE).

        An index of an older schema is dropped whole (the archive then rebuilds it
        from the org files), unless it can be brought up to date: layout 5 lacks
        the files' modification times (added, unknown: 0) and may lack the index on
        time (made: about 0.2 s per 100k messages, once), layout 4 also the
        partitions of `upgrade_from_4`."""
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if not force and (version == 5 or version == 4 and upgrade_from_4(db)):
                db.execute("ALTER TABLE files ADD COLUMN mtime INTEGER NOT NULL DEFAULT 0")
                db.execute(TIME_INDEX_SQL)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif force or version != SCHEMA_VERSION:
                for table in fts_tables(db) + list(_TABLES):
                    db.execute(f"DROP TABLE IF EXISTS {table}")
                for statement in [*_SCHEMA.split(";"), *PARTS_INDEXES]:
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO meta (key, value) VALUES ('tokenizer', ?)",
                           (self._partitions.tokenizer,))
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.forget_caches()

    def forget_caches(self) -> None:
        """Drop what is remembered about tables and common words (after another
        connection recreated or moved tables)."""
        self._partitions.forget_cache()
        self._counts.clear()
        self._rare.clear()
        self._sizes.clear()
        self.generation += 1

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    def clear(self) -> None:
        """Drop every indexed message and file size (the schema is recreated)."""
        self._create(self._db, force=True)

    def close(self) -> None:
        """Close the connection (if it was ever opened); the index is unusable after."""
        with self._opening:
            self._closed = True
            if self._connection is not None:
                self._connection.close()

    # -- writing -----------------------------------------------------------

    def _write(self, work) -> None:
        """Run WORK() in one write transaction (the table cache is dropped on failure;
        readers drop theirs once an owner's messages moved to a table of their own)."""
        self._db.execute("BEGIN IMMEDIATE")
        self._moved = False
        try:
            work()
            self._db.execute("COMMIT")
            if self._moved:
                self.generation += 1
        except BaseException:
            self._db.execute("ROLLBACK")
            self.forget_caches()
            raise

    @property
    def partition(self) -> Partition:
        """What names each thread's partition (its owner): see `set_partition`."""
        return self._partitions.partition

    def set_partition(self, partition: Partition) -> int:
        """Rank per PARTITION (thread -> owner name) from now on; threads indexed under
        another partition are moved.  Returns how many threads moved."""
        self._parts.partition = partition
        moves = self._parts.moves(partition)
        if moves:
            self._write(lambda: [self._parts.move(thread, part) for thread, part in moves])
            self.forget_caches()
            log.info("index: %d thread(s) moved to another owner's table", len(moves))
        return len(moves)

    def add(self, entries: Iterable[tuple[str, int, MessageRecord]]) -> int:
        """Index (file, offset, record) triples; already indexed ids are skipped.

        Returns how many were new.
        """
        added = 0

        def work() -> None:
            nonlocal added
            added = self._insert(entries)
        self._write(work)
        return added

    def add_writes(self, writes: Iterable[tuple[str, int, int, list, int]]) -> None:
        """Index WRITES (file, size before, size after, (offset, record) pairs, its
        modification time after) in ONE
        transaction, moving each file's indexed size on (see `set_file_size`).  A file
        written from empty (size before 0) starts with nothing indexed: whatever the
        index held under its name was of a file removed meanwhile."""
        stale = False

        def work() -> None:
            nonlocal stale
            for file, start, end, entries, mtime in writes:
                if start == 0:
                    stale = self._drop_file(file) or stale
                self._insert((file, offset, record) for offset, record in entries)
                self.set_file_size(file, end, previous=start, mtime=mtime)
        self._write(work)
        if stale:
            self._forgot()

    def _insert(self, entries: Iterable[tuple[str, int, MessageRecord]]) -> int:
        """Insert ENTRIES (inside a transaction); how many were new."""
        added = 0
        for file, offset, rec in entries:
            cursor = self._db.execute(
                f"INSERT OR IGNORE INTO messages ({COLUMNS}, file, offset) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*row_values(rec), file, offset))
            if cursor.rowcount == 1:
                if not is_control(rec.extra):
                    table = self._parts.table_of(rec.thread)
                    sender = who(rec.sender, rec.extra)
                    self._db.execute(
                        f"INSERT INTO {table} (rowid, text, thread, sender, cjk) "
                        "VALUES (?, ?, ?, ?, ?)", (cursor.lastrowid, rec.text,
                                                   thread_token(rec.thread), sender,
                                                   self._parts.terms(rec.text)))
                    if sender and self._parts.senders.note(table, sender):
                        self.generation += 1        # readers learn the new sender at once
                    self._moved = self._parts.grew(rec.thread) or self._moved
                added += 1
        return added

    def forget_file(self, file: str) -> None:
        """Remove every message indexed from FILE, and its recorded size."""
        self._write(lambda: self._drop_file(file))
        self._forgot()

    def _drop_file(self, file: str) -> bool:
        """`forget_file`'s deletions (inside a transaction), a re-read of FILE's ended
        with them; whether FILE was known."""
        self._parts.delete_file(file)
        self._db.execute("DELETE FROM messages WHERE file = ?", (file,))
        self._db.execute("DELETE FROM meta WHERE key = ?", (REREAD_KEY + file,))
        return self._db.execute("DELETE FROM files WHERE path = ?", (file,)).rowcount > 0

    def _forgot(self) -> None:
        """Messages were removed: counts and sizes are counted again."""
        self._counts.clear()
        self._rare.clear()
        self._sizes.clear()
        self.generation += 1      # a reader's cache of common words may be wrong now

    def file_sizes(self) -> dict[str, int]:
        """For each known org file, how many of its bytes are indexed."""
        return dict(self._db.execute("SELECT path, size FROM files"))

    def file_states(self) -> dict[str, tuple[int, int]]:
        """For each known org file, (how many of its bytes are indexed, its modification
        time in ns when the index last agreed with it: 0 unknown, as after an upgrade)."""
        return {path: (size, mtime) for path, size, mtime in
                self._db.execute("SELECT path, size, mtime FROM files")}

    def file_state(self, file: str) -> tuple[int, int] | None:
        """FILE's (indexed bytes, modification time) as `file_states` (None: unknown)."""
        row = self._db.execute("SELECT size, mtime FROM files WHERE path = ?",
                               (file,)).fetchone()
        return None if row is None else (row[0], row[1])

    def set_file_size(self, file: str, size: int, *, previous: int | None = None,
                      mtime: int = 0) -> bool:
        """Record that FILE is indexed up to SIZE bytes, as it was at modification time
        MTIME (ns; 0: unknown).

        With PREVIOUS, only move on from exactly that size (0 also matches an
        unknown file): a gap left by another process stays visible for catch-up.
        """
        db = self._db
        if previous is None:
            db.execute("INSERT OR REPLACE INTO files (path, size, mtime) VALUES (?, ?, ?)",
                       (file, size, mtime))
            return True
        if previous == 0:
            db.execute("INSERT OR IGNORE INTO files (path, size) VALUES (?, 0)", (file,))
        cursor = db.execute("UPDATE files SET size = ?, mtime = ? WHERE path = ? AND size = ?",
                            (size, mtime, file, previous))
        return cursor.rowcount == 1

    # -- reading -----------------------------------------------------------

    def count(self) -> int:
        return self._db.execute("SELECT count(*) FROM messages").fetchone()[0]

    def thread_of(self, message_id: str) -> Thread | None:
        """The thread holding the message MESSAGE_ID, or None when it is not indexed."""
        row = self._db.execute("SELECT channel, chat_id FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
        return None if row is None else Thread(*row)

    def platform_ids(self, thread: Thread) -> set[str]:
        """The PLATFORM_ID properties (a platform's message ids) of THREAD's messages."""
        return {value for (value,) in self._db.execute(
            "SELECT json_extract(extra, '$.PLATFORM_ID') FROM messages WHERE channel = ? "
            "AND chat_id = ? AND json_extract(extra, '$.PLATFORM_ID') IS NOT NULL",
            tuple(thread))}

    def history(self, thread: Thread, limit: int) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first."""
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? "
            "ORDER BY offset DESC LIMIT ?", (thread.channel, thread.chat_id, limit)).fetchall()
        return [MessageRecord(**record_fields(row)) for row in reversed(rows)]

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """All messages of THREAD, in file order."""
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? ORDER BY offset",
            (thread.channel, thread.chat_id)).fetchall()
        return [MessageRecord(**record_fields(row)) for row in rows]

    def undelivered(self, message_ids: Iterable[str]) -> set[str]:
        """Those of MESSAGE_IDS the person never got (see `rows.UNDELIVERED`)."""
        ids = list(message_ids)
        return {i for (i,) in self._db.execute(UNDELIVERED, (json.dumps(ids),))} if ids else set()

    def neighbours(self, message_id: str) -> tuple[MessageRecord | None, MessageRecord | None]:
        """The conversation messages just before and just after MESSAGE_ID in its thread's
        file (None at either end, or both when MESSAGE_ID is not indexed)."""
        return self.neighbours_of([message_id]).get(message_id, (None, None))

    def neighbours_of(self, message_ids: Iterable[str], *,
                      after_of: Iterable[str] | None = None,
                      before_with: Iterable[str] | None = None
                      ) -> dict[str, tuple[MessageRecord | None, MessageRecord | None]]:
        """`neighbours` of each of MESSAGE_IDS that is indexed, read by one query (two when
        a message after is looked for: only for the ids in AFTER_OF, default all); the
        one before (with BEFORE_WITH) only when its text holds one of BEFORE_WITH."""
        ids = list(message_ids)
        marks = None if before_with is None else json.dumps(list(before_with))
        found: dict[str, list[MessageRecord | None]] = {}
        for message_id, *row in self._db.execute(BEFORE_EACH, (json.dumps(ids), marks)):
            found[message_id] = [None if row[0] is None else
                                 MessageRecord(**record_fields(row)), None]
        wanted = [i for i in (ids if after_of is None else after_of) if i in found]
        if wanted:
            for message_id, *row in self._db.execute(AFTER_EACH, (json.dumps(wanted),)):
                found[message_id][1] = MessageRecord(**record_fields(row))
        return {message_id: (before, after) for message_id, (before, after) in found.items()}


"""The SQLite index over the org archive: recent history and FTS5 search.

The org files are the ground truth; this index is derived from them and can be
dropped and rebuilt at any time.  Tables:

- `messages`: one row per message with its file and byte offset (the order of
  a thread is the order of its file);
- `fts`: an FTS5 table over the message text, with the thread as a single
  opaque token in its own column so `thread:T AND (...)` narrows fast;
- `files`: for each org file, how many of its bytes are known to be indexed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from opencortex.events import Thread
from opencortex.memory.records import MessageRecord, SearchHit

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_QUERY_TERMS = 32
_COLUMNS = "id, role, text, channel, chat_id, sender, epoch, parent, turn_type, extra"
_SCHEMA = """
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL, text TEXT NOT NULL, channel TEXT NOT NULL, chat_id TEXT NOT NULL,
    sender TEXT, epoch REAL NOT NULL, parent TEXT, turn_type TEXT NOT NULL,
    extra TEXT NOT NULL, file TEXT NOT NULL, offset INTEGER NOT NULL);
CREATE INDEX messages_in_thread ON messages (channel, chat_id, offset);
CREATE INDEX messages_in_file ON messages (file);
CREATE TABLE files (path TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE VIRTUAL TABLE fts USING fts5 (text, thread, tokenize = 'unicode61 remove_diacritics 2');
INSERT INTO fts (fts, rank) VALUES ('rank', 'bm25(1.0, 0.0)');
"""


def thread_token(thread: Thread) -> str:
    """The single FTS token standing for THREAD."""
    return "t" + hashlib.sha256(str(thread).encode("utf-8")).hexdigest()[:24]


def match_query(text: str) -> str | None:
    """Turn user text into a safe FTS5 query: its words, each quoted, joined by OR.

    Returns None when the text holds no words.  Quoting makes every FTS5
    operator and special character plain text, so no syntax error can arise.
    """
    words = list(dict.fromkeys(text.replace("\0", " ").split()))[:MAX_QUERY_TERMS]
    if not words:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def _record(row: Sequence) -> dict:
    """The MessageRecord fields of a `messages` row selected as _COLUMNS."""
    (id_, role, text, channel, chat_id, sender, epoch, parent, turn_type, extra) = row[:10]
    return dict(id=id_, role=role, text=text, channel=channel, chat_id=chat_id,
                sender=sender, timestamp=epoch, parent=parent, turn_type=turn_type,
                extra=json.loads(extra))


class MessageIndex:
    """History and search over the archive, stored in one SQLite file (WAL mode)."""

    def __init__(self, path: Path):
        """Open the index at PATH; an unreadable one is deleted and created anew (empty).

        The archive then fills an empty index from the org files.
        """
        self.path = Path(path)
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as error:
            log.warning("index %s is unreadable (%s); rebuilding it", self.path,
                        type(error).__name__)
            self._remove_files()
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                self._create(db)
            db.execute("SELECT count(*) FROM files").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    @staticmethod
    def _create(db: sqlite3.Connection, *, force: bool = False) -> None:
        """(Re)create the schema, unless another process just did (or FORCE)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if force or version != SCHEMA_VERSION:
                for table in ("fts", "messages", "files"):
                    db.execute(f"DROP TABLE IF EXISTS {table}")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    def clear(self) -> None:
        """Drop every indexed message and file size (the schema is recreated)."""
        self._create(self._db, force=True)

    def close(self) -> None:
        self._db.close()

    # -- writing -----------------------------------------------------------

    def add(self, entries: Iterable[tuple[str, int, MessageRecord]]) -> int:
        """Index (file, offset, record) triples; already indexed ids are skipped.

        Returns how many were new.
        """
        added = 0
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for file, offset, rec in entries:
                cursor = db.execute(
                    f"INSERT OR IGNORE INTO messages ({_COLUMNS}, file, offset) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rec.id, rec.role, rec.text, rec.channel, rec.chat_id, rec.sender,
                     rec.timestamp, rec.parent, rec.turn_type,
                     json.dumps(rec.extra, sort_keys=True), file, offset))
                if cursor.rowcount == 1:
                    db.execute("INSERT INTO fts (rowid, text, thread) VALUES (?, ?, ?)",
                               (cursor.lastrowid, rec.text, thread_token(rec.thread)))
                    added += 1
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return added

    def forget_file(self, file: str) -> None:
        """Remove every message indexed from FILE, and its recorded size."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM fts WHERE rowid IN (SELECT seq FROM messages WHERE file = ?)",
                       (file,))
            db.execute("DELETE FROM messages WHERE file = ?", (file,))
            db.execute("DELETE FROM files WHERE path = ?", (file,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def file_sizes(self) -> dict[str, int]:
        """For each known org file, how many of its bytes are indexed."""
        return dict(self._db.execute("SELECT path, size FROM files"))

    def set_file_size(self, file: str, size: int, *, previous: int | None = None) -> bool:
        """Record that FILE is indexed up to SIZE bytes.

        With PREVIOUS, only move on from exactly that size (0 also matches an
        unknown file): a gap left by another process stays visible for catch-up.
        """
        db = self._db
        if previous is None:
            db.execute("INSERT OR REPLACE INTO files (path, size) VALUES (?, ?)", (file, size))
            return True
        if previous == 0:
            db.execute("INSERT OR IGNORE INTO files (path, size) VALUES (?, 0)", (file,))
        cursor = db.execute("UPDATE files SET size = ? WHERE path = ? AND size = ?",
                            (size, file, previous))
        return cursor.rowcount == 1

    # -- reading -----------------------------------------------------------

    def count(self) -> int:
        return self._db.execute("SELECT count(*) FROM messages").fetchone()[0]

    def history(self, thread: Thread, limit: int) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? "
            "ORDER BY offset DESC LIMIT ?", (thread.channel, thread.chat_id, limit)).fetchall()
        return [MessageRecord(**_record(row)) for row in reversed(rows)]

    def search(self, query: str, thread: Thread | None, limit: int) -> list[SearchHit]:
        """Best BM25 matches for the words of QUERY, optionally within THREAD."""
        words = match_query(query)
        if words is None:
            return []
        match = words if thread is None else f"thread:{thread_token(thread)} AND ({words})"
        try:
            ranked = self._db.execute(
                "SELECT rowid, rank FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT ?",
                (match, limit)).fetchall()
        except sqlite3.OperationalError as error:   # not expected: every word is quoted
            raise ValueError(f"search query could not be run ({error}); "
                             "try plain words without special characters") from None
        if not ranked:
            return []
        rowids = [rowid for rowid, _ in ranked]
        marks = ", ".join("?" * len(rowids))
        snippets = dict(self._db.execute(
            "SELECT rowid, snippet(fts, 0, '[', ']', '…', 12) FROM fts "
            f"WHERE fts MATCH ? AND rowid IN ({marks})", (match, *rowids)))
        rows = {row[-1]: row for row in self._db.execute(
            f"SELECT {_COLUMNS}, seq FROM messages WHERE seq IN ({marks})", rowids)}
        hits = []
        for rowid, rank in ranked:
            if rowid in rows and (thread is None or rows[rowid][3:5] == tuple(thread)):
                hits.append(SearchHit(**_record(rows[rowid]), score=-rank,
                                      snippet=snippets.get(rowid, "")))
        return hits

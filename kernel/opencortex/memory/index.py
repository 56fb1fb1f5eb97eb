"""The SQLite index over the org archive: recent history and FTS5 search.

The org files are the ground truth; this index is derived from them and can be
dropped and rebuilt at any time.  Tables:

- `messages`: one row per message with its file and byte offset (the order of
  a thread is the order of its file);
- `fts`: an FTS5 table over the message text, with the thread as a single
  opaque token in its own column so `thread:(A OR B) AND text:(...)` narrows
  fast.  Control records (a branch/head/pin note, marked by a CONTROL extra
  property) are kept in `messages` but never put in `fts`: search cannot
  return them;
- `files`: for each org file, how many of its bytes are known to be indexed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from opencortex.events import Thread
from opencortex.memory.records import MessageRecord, SearchHit

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_QUERY_TERMS = 32
CONTROL_KEY = "CONTROL"     # extra property marking a control record (never searchable)
COMMON_DOCS = 2000          # a word found in more messages than this is "very common"
MATCH_BUDGET = 4000         # most messages the words of one ranked search may match together
MAX_COMMON_CACHE = 4096     # most words remembered as very common
SEARCH_TIME_LIMIT = 0.25    # seconds a ranked search may run before the newest-first fallback
PROGRESS_STEPS = 10000      # SQLite VM steps between two checks of that limit
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


def query_phrases(text: str) -> list[str]:
    """The words of user text as quoted FTS5 phrases (first MAX_QUERY_TERMS, no repeats).

    Quoting makes every FTS5 operator and special character plain text, so no
    syntax error can arise.
    """
    words = list(dict.fromkeys(text.replace("\0", " ").split()))[:MAX_QUERY_TERMS]
    return ['"' + word.replace('"', '""') + '"' for word in words]


def match_query(text: str) -> str | None:
    """Turn user text into a safe FTS5 query: its words, each quoted, joined by OR.

    Returns None when the text holds no words.
    """
    return " OR ".join(query_phrases(text)) or None


def is_control(extra: Mapping[str, str]) -> bool:
    """True for a control record (branch/head/pin bookkeeping, not conversation)."""
    return CONTROL_KEY in extra


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
        self._common: set[str] = set()      # phrases known to be very common (see search)
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
        self._common.clear()

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
                    if not is_control(rec.extra):
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
        self._common.clear()

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

    def thread_of(self, message_id: str) -> Thread | None:
        """The thread holding the message MESSAGE_ID, or None when it is not indexed."""
        row = self._db.execute("SELECT channel, chat_id FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
        return None if row is None else Thread(*row)

    def history(self, thread: Thread, limit: int) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? "
            "ORDER BY offset DESC LIMIT ?", (thread.channel, thread.chat_id, limit)).fetchall()
        return [MessageRecord(**_record(row)) for row in reversed(rows)]

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """All messages of THREAD, in file order."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? ORDER BY offset",
            (thread.channel, thread.chat_id)).fetchall()
        return [MessageRecord(**_record(row)) for row in rows]

    def search(self, query: str, threads: Collection[Thread] | None, limit: int,
               exclude_ids: Collection[str] = ()) -> list[SearchHit]:
        """Best BM25 matches for the words of QUERY (any word), optionally only in THREADS.

        Messages whose id is in EXCLUDE_IDS and control records are never returned.
        Ranking costs time per matching message, and common words weigh little in
        BM25: the rarest words are kept while together they match at most
        MATCH_BUDGET messages (the rarest one always, unless it is very common:
        in more than COMMON_DOCS messages).  When every word is very common, or a
        ranked search runs longer than SEARCH_TIME_LIMIT, the newest matches are
        returned instead (no full ranking).
        """
        phrases = query_phrases(query)
        if not phrases or limit <= 0 or (threads is not None and not threads):
            return []
        scope = None if threads is None else {tuple(thread) for thread in threads}
        rare = self._rarest(phrases)
        words = f"text:({' OR '.join(rare or phrases)})"
        match = words
        if scope is not None:
            tokens = sorted({thread_token(Thread(*thread)) for thread in scope})
            match = f"thread:({' OR '.join(tokens)}) AND {words}"
        exclude = set(exclude_ids)
        wanted = limit + len(exclude)
        ranked = None
        if rare:
            ranked = self._matches(match, wanted, "rank", time_limit=SEARCH_TIME_LIMIT)
        if ranked is None:
            ranked = self._matches(match, wanted, "rowid DESC")
        if not ranked:
            return []
        rowids = [rowid for rowid, _ in ranked]
        marks = ", ".join("?" * len(rowids))
        rows = {row[-1]: row for row in self._db.execute(
            f"SELECT {_COLUMNS}, seq FROM messages WHERE seq IN ({marks})", rowids)}
        kept = [(rowid, rank) for rowid, rank in ranked
                if rowid in rows and rows[rowid][0] not in exclude
                and (scope is None or rows[rowid][3:5] in scope)][:limit]
        if not kept:
            return []
        marks = ", ".join("?" * len(kept))         # snippets need the words only (faster)
        snippets = dict(self._db.execute(
            "SELECT rowid, snippet(fts, 0, '[', ']', '…', 12) FROM fts "
            f"WHERE fts MATCH ? AND rowid IN ({marks})", (words, *(r for r, _ in kept))))
        hits = []
        for rowid, rank in kept:
            record = _record(rows[rowid])
            if not is_control(record["extra"]):    # an index built before control records
                hits.append(SearchHit(**record, score=-rank, snippet=snippets.get(rowid, "")))
        return hits

    def _rarest(self, phrases: list[str]) -> list[str]:
        """The rarest of PHRASES that together match at most MATCH_BUDGET messages
        (at least one, unless all are very common: then none)."""
        counted = sorted((self._frequency(phrase), n, phrase) for n, phrase in enumerate(phrases))
        kept, total = [], 0
        for found, _, phrase in counted:
            if found > COMMON_DOCS or (kept and total + found > MATCH_BUDGET):
                break
            kept.append(phrase)
            total += found
        return kept

    def _frequency(self, phrase: str) -> int:
        """In how many messages PHRASE occurs, counted up to COMMON_DOCS + 1."""
        if phrase in self._common:
            return COMMON_DOCS + 1
        found = self._db.execute(
            "SELECT count(*) FROM (SELECT 1 FROM fts WHERE fts MATCH ? LIMIT ?)",
            (f"text:{phrase}", COMMON_DOCS + 1)).fetchone()[0]
        if found > COMMON_DOCS:
            if len(self._common) >= MAX_COMMON_CACHE:
                self._common.clear()
            self._common.add(phrase)
        return found

    def _matches(self, match: str, limit: int, order: str,
                 time_limit: float | None = None) -> list[tuple[int, float]] | None:
        """(rowid, rank) of the first LIMIT matches in ORDER; None when TIME_LIMIT ran out."""
        if time_limit is not None:
            deadline = time.monotonic() + time_limit
            self._db.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        try:
            return self._db.execute(
                f"SELECT rowid, rank FROM fts WHERE fts MATCH ? ORDER BY {order} LIMIT ?",
                (match, limit)).fetchall()
        except sqlite3.OperationalError as error:
            if time_limit is not None and "interrupt" in str(error):
                log.info("ranked search ran past %.2f s; returning the newest matches",
                         time_limit)
                return None
            raise ValueError(f"search query could not be run ({error}); "   # not expected
                             "try plain words without special characters") from None
        finally:
            if time_limit is not None:
                self._db.set_progress_handler(None, 0)

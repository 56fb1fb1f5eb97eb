"""One FTS5 table per owner, so ranking uses that owner's own word statistics.

FTS5's bm25 takes term rarity and the average message length from the whole
table it searches.  With every owner in one table, a name that fills one
person's chats but is rare across the archive weighs far too much, and the
words of other people's chats decide what counts as rare.  So the index keeps
one FTS5 table per *partition*, and a partition is an owner: the function
that names it (`default_partition` unless `MessageIndex.set_partition` is
given the recall configuration's owner function) decides, per thread.

Tables:

- ``parts (name, tab)``: partition name -> the number N of its table ``fts_N``;
- ``thread_parts (channel, chat_id, part)``: which partition each thread is in;
- ``senders (tab, sender)``: who sent messages in each table, so a question's
  word can be known to name a sender without a search (`sender_words`); the
  ``senders`` row of ``meta`` counts its changes.

The partition shapes ranking, and lets recall search an owner's table whole
(`RankedSearch.search` by owners) at a cost that does not grow with the owner's
threads.  Isolation never rests on it alone: a search by threads filters by the
thread column, and recall checks every hit's owner with its own configuration.
Control records are never put in an FTS table.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
import time
import unicodedata
from collections.abc import Callable, Collection, Iterable

from opencortex.events import Thread
from opencortex.memory.cjk import cjk_terms
from opencortex.memory.query import fts_phrase
from opencortex.memory.rows import WHO

LOCAL_PARTITION = "local"
LOCAL_CHANNELS = frozenset({"emacs", "cli"})
TOKENIZERS = {
    "porter": "porter unicode61 remove_diacritics 2",      # English stemming (default)
    "unicode61": "unicode61 remove_diacritics 2",          # words as written
}
DEFAULT_TOKENIZER = "porter"
SHARED_TTL = 1.0            # seconds a table's thread count is reused, at most
SENDERS_TTL = 1.0           # seconds another process's new senders may go unnoticed
BM25_WEIGHTS = "1.0, 0.0, 0.0, 1.0"   # bm25 weights of the columns: text; thread and
                                      # sender are filters only; the text's Chinese and
                                      # Japanese terms (see `cjk`)
TEXT = "{text cjk}"         # the FTS5 columns a search of words looks in
NOT_CONTROL = "json_extract(extra, '$.CONTROL') IS NULL"
_WORD = re.compile(r"\w+")

Partition = Callable[[Thread], str]


def default_partition(thread: Thread) -> str:
    """The owner of THREAD without configuration: "local" for Emacs and terminal
    threads, else the thread itself ("telegram:123")."""
    thread = Thread(*thread)
    return LOCAL_PARTITION if thread.channel in LOCAL_CHANNELS else str(thread)


@functools.lru_cache(maxsize=4096)
def folded_words(text: str) -> tuple[str, ...]:
    """The words of TEXT as the tokenizers compare them: case and diacritics folded
    ("José" -> "jose"; "@alice:example.org" -> alice, example, org)."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return tuple(_WORD.findall("".join(c for c in decomposed
                                       if not unicodedata.combining(c))))


@functools.lru_cache(maxsize=4096)
def thread_token(thread: Thread) -> str:
    """The single FTS token standing for THREAD (remembered: one is hashed per insert)."""
    return "t" + hashlib.sha256(str(thread).encode("utf-8")).hexdigest()[:24]


def fts_tables(db: sqlite3.Connection) -> list[str]:
    """Names of the FTS5 tables in DB (any schema version: "fts" and "fts_N")."""
    return [name for (name,) in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%' "
        "AND (name = 'fts' OR name GLOB 'fts_[0-9]*')")]


class Partitions:
    """The FTS table of each thread, created on first use; threads moved when their
    partition changes.  Callers hold a transaction where they write."""

    def __init__(self, tokenizer: str = DEFAULT_TOKENIZER):
        """Partitions whose tables use TOKENIZER (a key of TOKENIZERS); `attach` a
        connection before use."""
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of: "
                             f"{', '.join(sorted(TOKENIZERS))}")
        self._db: sqlite3.Connection | None = None
        self.tokenizer = tokenizer
        self.partition: Partition = default_partition
        self._tables: dict[Thread, str] = {}
        self._named: dict[str, str] = {}                  # partition name -> its table
        self._shared: dict[str, tuple[int, float]] = {}   # table -> (threads, when counted)
        # the senders' change count when read, each table's sender words, when checked
        self._senders: tuple[str | None, dict[str, frozenset[str]], float] = (None, {}, 0.0)

    def attach(self, db: sqlite3.Connection) -> None:
        """Work on the index connection DB from now on."""
        db.create_function("cjk_terms", 1, cjk_terms, deterministic=True)
        self._db = db
        self.forget_cache()

    def forget_cache(self) -> None:
        """Drop what is remembered about tables (after the schema was recreated)."""
        self._tables.clear()
        self._named.clear()
        self._shared.clear()
        self._senders = (None, {}, 0.0)

    def table_of(self, thread: Thread) -> str:
        """The FTS table THREAD's messages go to (made, and the thread recorded, if new)."""
        thread = Thread(*thread)
        table = self._tables.get(thread)
        if table is None:
            row = self._db.execute(
                "SELECT tab FROM thread_parts JOIN parts ON part = name "
                "WHERE channel = ? AND chat_id = ?", tuple(thread)).fetchone()
            if row is None:
                part = self.partition(thread)
                number = self._table_number(part)
                self._db.execute("INSERT INTO thread_parts (channel, chat_id, part) "
                                 "VALUES (?, ?, ?)", (*thread, part))
            else:
                number = row[0]
            table = self._tables[thread] = f"fts_{number}"
        return table

    def known_table(self, thread: Thread) -> str | None:
        """THREAD's FTS table, or None when nothing of THREAD was ever indexed."""
        thread = Thread(*thread)
        if thread in self._tables:
            return self._tables[thread]
        row = self._db.execute(
            "SELECT tab FROM thread_parts JOIN parts ON part = name "
            "WHERE channel = ? AND chat_id = ?", tuple(thread)).fetchone()
        if row is None:
            return None
        table = self._tables[thread] = f"fts_{row[0]}"
        return table

    def tables(self) -> list[str]:
        """Every partition's FTS table."""
        return [f"fts_{n}" for (n,) in self._db.execute("SELECT tab FROM parts ORDER BY tab")]

    def tables_of(self, names: Collection[str]) -> list[str]:
        """The FTS tables of the partitions NAMES (one without a table yet has none)."""
        found = []
        for name in sorted(set(names)):
            table = self._named.get(name)
            if table is None:
                row = self._db.execute("SELECT tab FROM parts WHERE name = ?",
                                       (name,)).fetchone()
                if row is None:
                    continue
                table = self._named[name] = f"fts_{row[0]}"
            found.append(table)
        return found

    def threads_in(self, table: str) -> int:
        """How many threads share TABLE, counted again after SHARED_TTL seconds.  (A
        search uses it only to leave out its thread filter; what it returns is
        checked against its threads anyway.)"""
        now = time.monotonic()
        known = self._shared.get(table)
        if known is None or now - known[1] > SHARED_TTL:
            count = self._db.execute(
                "SELECT count(*) FROM thread_parts JOIN parts ON part = name WHERE tab = ?",
                (_number(table),)).fetchone()[0]
            known = self._shared[table] = (count, now)
        return known[0]

    def _table_number(self, part: str) -> int:
        """The table number of partition PART, making its FTS5 table when new."""
        row = self._db.execute("SELECT tab FROM parts WHERE name = ?", (part,)).fetchone()
        if row is not None:
            return row[0]
        number = self._db.execute("SELECT coalesce(max(tab), 0) + 1 FROM parts").fetchone()[0]
        self._db.execute("INSERT INTO parts (name, tab) VALUES (?, ?)", (part, number))
        self._db.execute(f"CREATE VIRTUAL TABLE fts_{number} USING fts5 "
                         f"(text, thread, sender, cjk, "
                         f"tokenize = '{TOKENIZERS[self.tokenizer]}')")
        self._db.execute(f"INSERT INTO fts_{number} (fts_{number}, rank) "
                         f"VALUES ('rank', 'bm25({BM25_WEIGHTS})')")
        return number

    # -- senders -------------------------------------------------------------

    def note_sender(self, table: str, sender: str) -> bool:
        """Record that SENDER has messages in TABLE; True when that is new (a change
        of the senders, counted in `meta`)."""
        if not self._db.execute("INSERT OR IGNORE INTO senders (tab, sender) VALUES (?, ?)",
                                (_number(table), sender)).rowcount:
            return False
        self._db.execute("INSERT INTO meta (key, value) VALUES ('senders', 1) ON CONFLICT"
                         "(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1")
        self._senders = (None, {}, 0.0)
        return True

    def sender_words(self, tables: Iterable[str]) -> dict[str, frozenset[str]]:
        """For each of TABLES, the folded words (see `folded_words`) of its senders.

        Read again when the senders changed: this connection's own changes at once
        (and, through the index's generation, its readers'); another process's, seen
        in their change count, looked up at most every SENDERS_TTL seconds."""
        known, words, checked = self._senders
        now = time.monotonic()
        if now - checked > SENDERS_TTL:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'senders'").fetchone()
            changes = None if row is None else str(row[0])
            if changes != known:
                words = {}
            self._senders = (changes, words, now)
        for table in tables:
            if table not in words:
                words[table] = frozenset(word for (sender,) in self._db.execute(
                    "SELECT sender FROM senders WHERE tab = ?", (_number(table),))
                    for word in folded_words(sender))
        return words

    def _drop_senders(self, table: str, senders: Iterable[str]) -> None:
        """Forget those of SENDERS that no message left in TABLE was sent by."""
        gone = [sender for sender in senders if not self._db.execute(
            f"SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT 1",
            (f"sender:{fts_phrase(sender)}",)).fetchone()]
        for sender in gone:
            self._db.execute("DELETE FROM senders WHERE tab = ? AND sender = ?",
                             (_number(table), sender))
        if gone:
            self._db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 "
                             "WHERE key = 'senders'")
            self._senders = (None, {}, 0.0)

    def _senders_of(self, where: str, values: tuple) -> list[str]:
        """Who sent the messages WHERE says (see `rows.WHO`), each once."""
        return [sender for (sender,) in self._db.execute(
            f"SELECT DISTINCT {WHO} FROM messages WHERE {where} AND {NOT_CONTROL}", values)
            if sender]

    # -- moving and deleting --------------------------------------------------

    def moves(self, partition: Partition) -> list[tuple[Thread, str]]:
        """Threads whose partition under PARTITION differs from the recorded one."""
        rows = self._db.execute("SELECT channel, chat_id, part FROM thread_parts").fetchall()
        return [(Thread(c, i), partition(Thread(c, i))) for c, i, part in rows
                if partition(Thread(c, i)) != part]

    def move(self, thread: Thread, part: str) -> None:
        """Move THREAD's searchable messages to partition PART's table."""
        old = self.table_of(thread)
        senders = self._senders_of("channel = ? AND chat_id = ?", tuple(thread))
        self._db.execute(f"DELETE FROM {old} WHERE rowid IN (SELECT seq FROM messages "
                         "WHERE channel = ? AND chat_id = ?)", tuple(thread))
        self._drop_senders(old, senders)
        new = f"fts_{self._table_number(part)}"
        self._db.execute("UPDATE thread_parts SET part = ? WHERE channel = ? AND chat_id = ?",
                         (part, *thread))
        self._db.execute(f"INSERT INTO {new} (rowid, text, thread, sender, cjk) "
                         f"SELECT seq, text, ?, {WHO}, cjk_terms(text) FROM messages "
                         f"WHERE channel = ? AND chat_id = ? AND {NOT_CONTROL}",
                         (thread_token(thread), *thread))
        for sender in senders:
            self.note_sender(new, sender)
        self._tables[Thread(*thread)] = new

    def delete_file(self, file: str) -> None:
        """Remove the messages indexed from FILE from their threads' tables."""
        self.delete_where("file = ?", (file,))

    def delete_where(self, where: str, values: tuple) -> None:
        """Remove the messages WHERE (a condition on `messages`, with VALUES) says from
        their threads' tables (the `messages` rows stay: the caller deletes them)."""
        threads = self._db.execute(f"SELECT DISTINCT channel, chat_id FROM messages "
                                   f"WHERE {where}", values).fetchall()
        for channel, chat_id in threads:
            table = self.known_table(Thread(channel, chat_id))
            if table is not None:
                condition = f"{where} AND channel = ? AND chat_id = ?"
                bound = (*values, channel, chat_id)
                senders = self._senders_of(condition, bound)
                self._db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT seq FROM messages "
                                 f"WHERE {condition})", bound)
                self._drop_senders(table, senders)


def _number(table: str) -> int:
    """The number N of the table "fts_N"."""
    return int(table.removeprefix("fts_"))

"""An FTS5 table per owner, so ranking uses that owner's own word statistics.

FTS5's bm25 takes term rarity and the average message length from the whole
table it searches.  With every owner in one table, a name that fills one
person's chats but is rare across the archive weighs far too much, and the
words of other people's chats decide what counts as rare.  So the index keeps
FTS5 tables per *partition*, and a partition is an owner: the function that
names it (`default_partition` unless `MessageIndex.set_partition` is given the
recall configuration's owner function) decides, per thread.

A table costs every opening of the index time (SQLite reads the whole schema;
3,000 tables took 0.65 s, and the cost grows faster than their number), and
strangers on a bridge can bring owners without end.  So the first OWN_TABLES
owners (and "local" always) get a table of their own; later ones share one of
SHARED_TABLES tables, chosen by a hash of their name, until they have OWN_FROM
messages, when their messages move to a table of their own.  A search of a
shared table filters by the owner's threads; its word statistics are those of
the owners sharing it.

Tables:

- ``parts (name, tab)``: partition name -> the number N of its table ``fts_N``
  (numbers from SHARED_BASE on are the shared tables);
- ``thread_parts (channel, chat_id, part)``: which partition each thread is in;
- ``senders (tab, sender)``: who sent messages in each table (see `senders`).

The partition shapes ranking, and lets recall search an owner's table whole
(`RankedSearch.search` by owners) at a cost that does not grow with the owner's
threads.  Isolation never rests on it alone: a search by threads filters by the
thread column, and recall checks every hit's owner with its own configuration.
Control records are never put in an FTS table.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import time
from collections.abc import Callable, Collection

from opencortex.events import Thread
from opencortex.memory.rows import NOT_CONTROL, WHO
from opencortex.memory.senders import TableSenders, table_number
from opencortex.memory.stems import (PREFIX, language_of, query_stemmer, snowball_languages,
                                     terms_function)

LOCAL_PARTITION = "local"
LOCAL_CHANNELS = frozenset({"emacs", "cli"})
TOKENIZERS = {
    "porter": "porter unicode61 remove_diacritics 2",      # English stemming (default)
    "unicode61": "unicode61 remove_diacritics 2",          # words as written
}
DEFAULT_TOKENIZER = "porter"
ENGLISH = frozenset({"porter", PREFIX + "english"})   # tokenizers that stem English
SHARED_TTL = 1.0            # seconds a table's thread count is reused, at most
BM25_WEIGHTS = "1.0, 0.0, 0.0, 1.0"   # bm25 weights of the columns: text; thread and
                                      # sender are filters only; the terms kept beside
                                      # the text (see `stems.terms_function`)
TEXT = "{text cjk}"         # the FTS5 columns a search of words looks in
OWN_TABLES = 256            # owners given a table of their own as they come; later ones share
SHARED_TABLES = 32          # the tables those share, each owner's chosen by a hash of its name
OWN_FROM = 500              # messages at which an owner sharing a table gets one of its own
GROWTH_CHECK = 64           # messages added to a sharing owner between two counts of its own
SHARED_BASE = 1_000_000_000  # the number of the first shared table (own ones count from 1)
MAX_GROWTH = 4096           # sharing partitions whose additions are counted at most
MAX_REMEMBERED = 8192       # threads (and partitions) whose table a connection remembers

Partition = Callable[[Thread], str]


def default_partition(thread: Thread) -> str:
    """The owner of THREAD without configuration: "local" for Emacs and terminal
    threads, else its chat ("telegram:123"; a topic's: see `Thread.chat`)."""
    thread = Thread(*thread)
    return LOCAL_PARTITION if thread.channel in LOCAL_CHANNELS else str(thread.chat)


@functools.lru_cache(maxsize=4096)
def thread_token(thread: Thread) -> str:
    """The single FTS token standing for THREAD (remembered: one is hashed per insert)."""
    return "t" + hashlib.sha256(str(thread).encode("utf-8")).hexdigest()[:24]


def fts_tables(db: sqlite3.Connection) -> list[str]:
    """Names of the FTS5 tables in DB (any schema version: "fts" and "fts_N")."""
    return [name for (name,) in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%' "
        "AND (name = 'fts' OR name GLOB 'fts_[0-9]*')")]


# The table of partitions and the indexes of partitions (see the module), as `index`
# makes them (layout 5) and `upgrade_from_4` brings them up to it.
PARTS_TABLE = "CREATE TABLE parts (name TEXT PRIMARY KEY, tab INTEGER NOT NULL)"
PARTS_INDEXES = ("CREATE INDEX parts_in_table ON parts (tab)",
                 "CREATE INDEX threads_of_part ON thread_parts (part)")


def upgrade_from_4(db: sqlite3.Connection) -> bool:
    """Bring the partition tables of an index of layout 4 (where every partition had a
    table of its own) up to layout 5, in DB's transaction, when it has at most
    OWN_TABLES partitions; False (nothing done) when it has more: rebuilt, the index
    then places them anew, most in shared tables."""
    if db.execute("SELECT count(*) FROM parts").fetchone()[0] > OWN_TABLES:
        return False
    db.execute("ALTER TABLE parts RENAME TO parts_4")
    db.execute(PARTS_TABLE)
    db.execute("INSERT INTO parts (name, tab) SELECT name, tab FROM parts_4")
    db.execute("DROP TABLE parts_4")
    for statement in PARTS_INDEXES:
        db.execute(statement)
    return True


def fts_tokenizer(tokenizer: str) -> str:
    """The FTS5 `tokenize` option of TOKENIZER (the index's tokenizer name): a key of
    TOKENIZERS, or "snowball-LANGUAGE", whose tables split words as written (the
    stems are kept beside the text: see `stems`)."""
    return TOKENIZERS["unicode61" if language_of(tokenizer) else tokenizer]


class Partitions:
    """The FTS table of each thread, created on first use; threads moved when their
    partition changes, and an owner's when it outgrows a shared table.  Callers hold
    a transaction where they write."""

    def __init__(self, tokenizer: str = DEFAULT_TOKENIZER):
        """Partitions whose tables use TOKENIZER (a key of TOKENIZERS, or
        "snowball-LANGUAGE": see `fts_tokenizer`); `attach` a connection before use."""
        language = language_of(tokenizer)
        if tokenizer not in TOKENIZERS and (language is None or
                                            language not in snowball_languages()):
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of: "
                             f"{', '.join(sorted(TOKENIZERS))}, or {PREFIX}LANGUAGE")
        self._db: sqlite3.Connection | None = None
        self.tokenizer = tokenizer
        self.terms = terms_function(tokenizer)     # what the column beside the text holds
        self.stem = query_stemmer(tokenizer)       # a question's words as searched, or None
        self.partition: Partition = default_partition
        self._placed: dict[Thread, tuple[str, str]] = {}  # thread -> (partition, table)
        self._named: dict[str, str] = {}                  # partition name -> its table
        self._shared: dict[str, tuple[int, float]] = {}   # table -> (threads, when counted)
        self._growth: dict[str, int] = {}   # sharing partition -> messages added here
        self.senders = TableSenders()

    def attach(self, db: sqlite3.Connection) -> None:
        """Work on the index connection DB from now on."""
        db.create_function("index_terms", 1, self.terms, deterministic=True)
        self._db = db
        self.senders.attach(db)
        self.forget_cache()

    def forget_cache(self) -> None:
        """Drop what is remembered about tables (after the schema was recreated)."""
        self._placed.clear()
        self._named.clear()
        self._shared.clear()
        self._growth.clear()
        self.senders.forget()

    def table_of(self, thread: Thread) -> str:
        """The FTS table THREAD's messages go to (made, and the thread recorded, if new)."""
        thread = Thread(*thread)
        placed = self._placed_of(thread)
        if placed is None:
            part = self.partition(thread)
            number = self._table_number(part)
            self._db.execute("INSERT INTO thread_parts (channel, chat_id, part) "
                             "VALUES (?, ?, ?)", (*thread, part))
            placed = self._remember(thread, (part, f"fts_{number}"))
        return placed[1]

    def known_table(self, thread: Thread) -> str | None:
        """THREAD's FTS table, or None when nothing of THREAD was ever indexed."""
        thread = Thread(*thread)
        placed = self._placed_of(thread)
        return None if placed is None else placed[1]

    def _placed_of(self, thread: Thread) -> tuple[str, str] | None:
        """THREAD's recorded (partition, table), remembered; None when it has none."""
        placed = self._placed.get(thread)
        if placed is not None:
            return placed
        row = self._db.execute(
            "SELECT part, tab FROM thread_parts JOIN parts ON part = name "
            "WHERE channel = ? AND chat_id = ?", tuple(thread)).fetchone()
        if row is None:
            return None
        return self._remember(thread, (row[0], f"fts_{row[1]}"))

    def _remember(self, thread: Thread, placed: tuple[str, str]) -> tuple[str, str]:
        """Remember THREAD's PLACED (partition, table), among MAX_REMEMBERED threads at
        most (the threads of strangers come without end); PLACED."""
        if len(self._placed) >= MAX_REMEMBERED:
            self._placed.clear()
        self._placed[thread] = placed
        return placed

    def tables(self) -> list[str]:
        """Every partition's FTS table."""
        return [f"fts_{n}" for (n,) in self._db.execute(
            "SELECT DISTINCT tab FROM parts ORDER BY tab")]

    def targets_of(self, names: Collection[str]) -> list[tuple[str, list[str] | None]]:
        """(table, thread tokens to filter on, or None for the whole table) to search
        for the partitions NAMES: a table of their own whole, a shared one for their
        threads (a partition without a table yet has none)."""
        by_table: dict[str, list[str]] = {}
        for name in sorted(set(names)):
            table = self._named.get(name)
            if table is None:
                row = self._db.execute("SELECT tab FROM parts WHERE name = ?",
                                       (name,)).fetchone()
                if row is None:
                    continue
                if len(self._named) >= MAX_REMEMBERED:
                    self._named.clear()
                table = self._named[name] = f"fts_{row[0]}"
            by_table.setdefault(table, []).append(name)
        targets: list[tuple[str, list[str] | None]] = []
        for table, members in sorted(by_table.items()):
            if not is_shared(table):
                targets.append((table, None))
                continue
            tokens = sorted(thread_token(Thread(*row)) for row in self._db.execute(
                f"SELECT channel, chat_id FROM thread_parts WHERE part IN "
                f"({', '.join('?' * len(members))})", members))
            if tokens:
                targets.append((table, tokens))
        return targets

    def threads_in(self, table: str) -> int:
        """How many threads share TABLE, counted again after SHARED_TTL seconds.  (A
        search uses it only to leave out its thread filter; what it returns is
        checked against its threads anyway.)"""
        now = time.monotonic()
        known = self._shared.get(table)
        if known is None or now - known[1] > SHARED_TTL:
            count = self._db.execute(
                "SELECT count(*) FROM thread_parts JOIN parts ON part = name WHERE tab = ?",
                (table_number(table),)).fetchone()[0]
            known = self._shared[table] = (count, now)
        return known[0]

    def _table_number(self, part: str) -> int:
        """The table number of partition PART, placing it when new: a table of its own
        while fewer than OWN_TABLES partitions have one ("local" always), else
        a shared one."""
        row = self._db.execute("SELECT tab FROM parts WHERE name = ?", (part,)).fetchone()
        if row is not None:
            return row[0]
        own = self._db.execute("SELECT count(*) FROM parts WHERE tab < ?",
                               (SHARED_BASE,)).fetchone()[0]
        number = self._new_table() if part == LOCAL_PARTITION or own < OWN_TABLES \
            else self._shared_table(part)
        self._db.execute("INSERT INTO parts (name, tab) VALUES (?, ?)", (part, number))
        return number

    def _new_table(self) -> int:
        """The number of a new table of its own, made."""
        number = self._db.execute("SELECT coalesce(max(tab), 0) + 1 FROM parts WHERE tab < ?",
                                  (SHARED_BASE,)).fetchone()[0]
        self._make_table(number)
        return number

    def _shared_table(self, part: str) -> int:
        """The number of the shared table PART goes to (made when it is the first)."""
        digest = hashlib.sha256(part.encode("utf-8")).digest()
        number = SHARED_BASE + int.from_bytes(digest[:8], "big") % SHARED_TABLES
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                            (f"fts_{number}",)).fetchone() is None:
            self._make_table(number)
        return number

    def _make_table(self, number: int) -> None:
        """Make the FTS5 table fts_NUMBER, ranked with BM25_WEIGHTS."""
        self._db.execute(f"CREATE VIRTUAL TABLE fts_{number} USING fts5 "
                         f"(text, thread, sender, cjk, "
                         f"tokenize = '{fts_tokenizer(self.tokenizer)}')")
        self._db.execute(f"INSERT INTO fts_{number} (fts_{number}, rank) "
                         f"VALUES ('rank', 'bm25({BM25_WEIGHTS})')")

    def grew(self, thread: Thread) -> bool:
        """Note that a message of THREAD was just added to its table; when its partition
        shares a table and has reached OWN_FROM messages, move the partition to a table
        of its own (True: tables moved)."""
        thread = Thread(*thread)
        part, table = self._placed_of(thread)
        if not is_shared(table):
            return False
        if len(self._growth) >= MAX_GROWTH:
            self._growth.clear()
        added = self._growth[part] = self._growth.get(part, 0) + 1
        if added % GROWTH_CHECK or self._messages_of(part) < OWN_FROM:
            return False
        self._own_table_for(part, table)
        return True

    def _messages_of(self, part: str) -> int:
        """How many messages the threads of partition PART have in the index."""
        return self._db.execute(
            "SELECT count(*) FROM thread_parts t JOIN messages m ON m.channel = t.channel "
            "AND m.chat_id = t.chat_id WHERE t.part = ?", (part,)).fetchone()[0]

    def _own_table_for(self, part: str, shared: str) -> None:
        """Move partition PART's messages from the table SHARED to a new one of its own."""
        own = f"fts_{self._new_table()}"
        self._db.execute("UPDATE parts SET tab = ? WHERE name = ?", (table_number(own), part))
        threads = [Thread(*row) for row in self._db.execute(
            "SELECT channel, chat_id FROM thread_parts WHERE part = ?", (part,))]
        for thread in threads:
            self._relocate(thread, shared, own)
        self.forget_cache()

    # -- moving and deleting --------------------------------------------------

    def moves(self, partition: Partition) -> list[tuple[Thread, str]]:
        """Threads whose partition under PARTITION differs from the recorded one."""
        rows = self._db.execute("SELECT channel, chat_id, part FROM thread_parts").fetchall()
        return [(Thread(c, i), partition(Thread(c, i))) for c, i, part in rows
                if partition(Thread(c, i)) != part]

    def move(self, thread: Thread, part: str) -> None:
        """Move THREAD's searchable messages to partition PART's table."""
        old = self.table_of(thread)
        new = f"fts_{self._table_number(part)}"
        self._db.execute("UPDATE thread_parts SET part = ? WHERE channel = ? AND chat_id = ?",
                         (part, *thread))
        self._relocate(thread, old, new)
        self._remember(Thread(*thread), (part, new))

    def _relocate(self, thread: Thread, old: str, new: str) -> None:
        """Move THREAD's searchable messages from table OLD to table NEW, with their
        senders."""
        senders = self.senders.of_messages("channel = ? AND chat_id = ?", tuple(thread))
        self._db.execute(f"DELETE FROM {old} WHERE rowid IN (SELECT seq FROM messages "
                         "WHERE channel = ? AND chat_id = ?)", tuple(thread))
        self.senders.drop(old, senders)
        self._db.execute(f"INSERT INTO {new} (rowid, text, thread, sender, cjk) "
                         f"SELECT seq, text, ?, {WHO}, index_terms(text) FROM messages "
                         f"WHERE channel = ? AND chat_id = ? AND {NOT_CONTROL}",
                         (thread_token(thread), *thread))
        for sender in senders:
            self.senders.note(new, sender)

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
                senders = self.senders.of_messages(condition, bound)
                self._db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT seq FROM messages "
                                 f"WHERE {condition})", bound)
                self.senders.drop(table, senders)


def is_shared(table: str) -> bool:
    """Whether TABLE is one the partitions past OWN_TABLES share."""
    return table_number(table) >= SHARED_BASE

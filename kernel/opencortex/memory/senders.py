"""Who sent messages in each FTS table of the index, so a question's word can be known
to name a sender without a search ("What did Caroline give?").

Table ``senders (tab, sender)`` lists, for each table number, the senders (see
`rows.WHO`) of its messages; the ``senders`` row of ``meta`` counts its changes,
so another process's connection learns of them.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
import unicodedata
from collections.abc import Iterable

from opencortex.memory.query import fts_phrase
from opencortex.memory.rows import NOT_CONTROL, WHO

SENDERS_TTL = 1.0           # seconds another process's new senders may go unnoticed
_WORD = re.compile(r"\w+")


def fold_words(text: str) -> tuple[str, ...]:
    """The words of TEXT as the tokenizers compare them: case and diacritics folded
    ("José" -> "jose"; "@alice:example.org" -> alice, example, org)."""
    folded = text.casefold()
    if folded.isascii():                    # nothing to decompose: the quick way
        return tuple(_WORD.findall(folded))
    decomposed = unicodedata.normalize("NFKD", folded)
    return tuple(_WORD.findall("".join(c for c in decomposed
                                       if not unicodedata.combining(c))))


folded_words = functools.lru_cache(maxsize=4096)(fold_words)   # names: few, asked often


def table_number(table: str) -> int:
    """The number N of the FTS table "fts_N"."""
    return int(table.removeprefix("fts_"))


class TableSenders:
    """The senders of each FTS table, on one index connection (`attach` it first);
    callers hold a transaction where they write."""

    def __init__(self) -> None:
        self._db: sqlite3.Connection | None = None
        # the senders' change count when read, each table's sender words, when checked
        self._known: tuple[str | None, dict[str, frozenset[str]], float] = (None, {}, 0.0)

    def attach(self, db: sqlite3.Connection) -> None:
        """Work on the index connection DB from now on."""
        self._db = db
        self.forget()

    def forget(self) -> None:
        """Drop the senders' words read so far."""
        self._known = (None, {}, 0.0)

    def note(self, table: str, sender: str) -> bool:
        """Record that SENDER has messages in TABLE; True when that is new (a change
        of the senders, counted in `meta`)."""
        if not self._db.execute("INSERT OR IGNORE INTO senders (tab, sender) VALUES (?, ?)",
                                (table_number(table), sender)).rowcount:
            return False
        self._db.execute("INSERT INTO meta (key, value) VALUES ('senders', 1) ON CONFLICT"
                         "(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1")
        self.forget()
        return True

    def words(self, tables: Iterable[str]) -> dict[str, frozenset[str]]:
        """For each of TABLES, the folded words (see `folded_words`) of its senders.

        Read again when the senders changed: this connection's own changes at once
        (and, through the index's generation, its readers'); another process's, seen
        in their change count, looked up at most every SENDERS_TTL seconds."""
        known, words, checked = self._known
        now = time.monotonic()
        if now - checked > SENDERS_TTL:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'senders'").fetchone()
            changes = None if row is None else str(row[0])
            if changes != known:
                words = {}
            self._known = (changes, words, now)
        for table in tables:
            if table not in words:
                words[table] = frozenset(word for (sender,) in self._db.execute(
                    "SELECT sender FROM senders WHERE tab = ?", (table_number(table),))
                    for word in folded_words(sender))
        return words

    def drop(self, table: str, senders: Iterable[str]) -> None:
        """Forget those of SENDERS that no message left in TABLE was sent by."""
        gone = [sender for sender in senders if not self._db.execute(
            f"SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT 1",
            (f"sender:{fts_phrase(sender)}",)).fetchone()]
        for sender in gone:
            self._db.execute("DELETE FROM senders WHERE tab = ? AND sender = ?",
                             (table_number(table), sender))
        if gone:
            self._db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 "
                             "WHERE key = 'senders'")
            self.forget()

    def of_messages(self, where: str, values: tuple) -> list[str]:
        """Who sent the messages WHERE (a condition on `messages`, with VALUES) says,
        each once."""
        return [sender for (sender,) in self._db.execute(
            f"SELECT DISTINCT {WHO} FROM messages WHERE {where} AND {NOT_CONTROL}", values)
            if sender]

"""Ranked full-text search over the index: BM25 per owner, bounded in time.

`RankedSearch` is a part of `MessageIndex` (kept apart for size): it reads the
FTS5 tables the index writes, one per owner (see `partitions`).  Ranking costs
time per matching message, and common words weigh little in BM25, so only the
rarer words of a query are ranked (see `RankedSearch.search`).
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import closing

from opencortex.events import Thread
from opencortex.memory.partitions import (BM25_WEIGHTS, ENGLISH, TEXT, Partitions,
                                          thread_token)
from opencortex.memory.query import fts_phrase, query_phrases, query_words
from opencortex.memory.records import SearchHit
from opencortex.memory.rows import (COLUMNS, columns_of, is_control,
                                   record_fields, text_key)
from opencortex.memory.senders import folded_words

log = logging.getLogger(__name__)
_MISSING = (None,) * len(COLUMNS.split(","))      # the columns of a match without its message
_HIGHLIGHTED = re.compile("\x02([^\x02\x03]*)\x03")   # a matched word, as `_snippets` marks it

COMMON_DOCS = 2000          # a word found in more messages than this is "very common"
WEIGHTLESS_FLOOR = 50       # ... as is one in more than half of an owner's and than this
MATCH_BUDGET = 4000         # most messages the words of one ranked search may match together
MAX_COUNTS = 4096           # most word counts remembered
COUNTED_FROM = 64           # a word found in fewer messages is counted again each time
STALE_SHARE = 8             # a count is reused while its table grew by less than 1/8 of it
SIZE_TTL = 1.0              # seconds a table's message count is reused, at most
DISTINCT_READS = 4          # a DISTINCT search reads this many times more matches
SEARCH_TIME_LIMIT = 0.25    # seconds a ranked search may run before the newest-first fallback
PROGRESS_STEPS = 10000      # SQLite VM steps between two checks of that limit


class RankedSearch:
    """Search for a MessageIndex (which provides `_db`, `_parts`, `_common`, `_sizes`)."""

    _db: sqlite3.Connection
    _parts: Partitions
    _counts: dict[tuple[str, str], tuple[int, int]]   # (table, phrase) -> (found, size)
    _rare: dict[tuple[str, str], int]                  # (table, phrase) -> found, while
    _rare_state: tuple[int, int] | None                # the index is in this state
    _sizes: dict[str, tuple[int, float]]
    _said_any_within: Callable[..., bool]          # see `timeline.ThreadTimeline`

    def search(self, query: str, threads: Collection[Thread] | None, limit: int,
               exclude_ids: Collection[str] = (),
               window: tuple[float, float] | None = None, *,
               snippets: bool = True, candidates: int | None = None,
               owners: Collection[str] | None = None,
               informative_only: bool = False, senders: Collection[str] = (),
               distinct: bool = False, required: str = "") -> list[SearchHit]:
        """Best BM25 matches for the words of QUERY (any word), optionally only in THREADS
        or only in the tables of OWNERS (partitions: see `partitions`), only said
        within WINDOW (start, end epoch seconds, end excluded), and only sent by
        someone whose sender holds one of the words SENDERS (see `speakers`); with
        CANDIDATES (>= LIMIT), the first LIMIT of a search for that many.  DISTINCT:
        a text already returned (bar case and spacing) is passed over, so repeated
        small talk does not fill the hits.  REQUIRED: only messages that hold one of
        its words as well (QUERY's other words then only rank them): "Caroline work"
        requiring "work" passes over the messages that merely greet Caroline.

        A search by OWNERS costs the same however many threads they have; one by
        THREADS looks at each thread (and filters by thread unless they fill
        their tables).

        Each owner's table is ranked with its own statistics; results of several
        owners are merged by score.  Messages whose id is in EXCLUDE_IDS and
        control records are never returned.  Ranking costs time per matching
        message, and common words weigh little in BM25: the rarest words (in
        the owner's table) are ranked while together they match at most
        MATCH_BUDGET messages (the rarest one always, unless it is very common:
        in more than COMMON_DOCS messages, or in more than half of the owner's
        where BM25 weighs it ~0).  When every word is very common, or a ranked
        search runs longer than SEARCH_TIME_LIMIT, the newest matches are
        returned instead (no full ranking); with INFORMATIVE_ONLY, when every word
        is very common, nothing (what those words match says nothing of the query).
        """
        phrases = query_phrases(query, verb_forms=self._parts.tokenizer in ENGLISH,
                                stem=self._parts.stem)
        if not phrases or limit <= 0 or (threads is not None and not threads):
            return []
        if threads is not None and owners is not None:
            raise ValueError("search by threads or by owners, not both")
        scope = None if threads is None else {Thread(*thread) for thread in threads}
        if window is not None and not self._said_any_within(window, scope, owners):
            return []
        exclude = exclude_ids if isinstance(exclude_ids, AbstractSet) else set(exclude_ids)
        texts: set[str] = set()
        self._note_state()

        def returnable(row: tuple) -> bool:
            """Whether a matched ROW may be returned: indexed, not excluded, in scope
            (and, when DISTINCT, a text not returned yet)."""
            if row[2] is None or row[2] in exclude or \
                    (scope is not None and Thread(row[5], row[6]) not in scope):
                return False
            if distinct:
                text = text_key(row[4])
                if text in texts:
                    return False
                texts.add(text)
            return True
        found: list[tuple[tuple, tuple, str, str]] = []       # key, row, table, words
        read = max(limit, candidates or limit) * (DISTINCT_READS if distinct else 1)
        wanted = (limit, read + len(exclude))                 # kept, read
        by = [] if not senders else query_phrases(" ".join(senders))
        needed = [] if not required.strip() else query_phrases(
            required, verb_forms=self._parts.tokenizer in ENGLISH, stem=self._parts.stem)
        if required.strip() and not needed:
            return []
        for table, tokens in self._where(scope, owners):
            found += self._search_table(table, tokens, phrases, wanted, window, returnable,
                                        informative_only, by, needed)
        found.sort(key=lambda item: item[0])
        kept = found[:limit]
        marked = self._snippets(kept) if snippets else {}
        hits = []
        for _, row, _, _ in kept:
            record = record_fields(row[2:])
            if not is_control(record["extra"]):    # an index built before control records
                snippet, matched = marked.get(row[0], ("", []))
                hits.append(SearchHit(**record, score=-row[1], snippet=snippet,
                                      matched=matched))
        return hits

    def speakers(self, query: str, threads: Collection[Thread] | None = None,
                 owners: Collection[str] | None = None) -> list[str]:
        """The words of QUERY that name a sender of messages in THREADS (or in the
        tables of OWNERS; neither: any), case and diacritics aside ("Caroline's"
        names "Caroline"; "alice" names "@alice:example.org").

        Known from each table's list of senders; where only some threads of a
        table are in scope, checked in the index for those threads."""
        scope = None if threads is None else {Thread(*thread) for thread in threads}
        where = self._where(scope, owners)
        senders = self._parts.senders.words(table for table, _ in where)
        where = [(table, tokens) for table, tokens in where if senders[table]]
        named = []
        for word in query_words(query) if where else ():
            parts = folded_words(word)
            for table, tokens in where:
                if parts and senders[table].issuperset(parts) and (
                        tokens is None or self._sends_in(table, tokens, word)):
                    named.append(word)
                    break
        return named

    def _sends_in(self, table: str, tokens: list[str], word: str) -> bool:
        """Whether a sender holding WORD has a message in the threads TOKENS of TABLE."""
        match = f"thread:({' OR '.join(tokens)}) AND sender:{fts_phrase(word)}"
        return self._db.execute(f"SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT 1",
                                (match,)).fetchone() is not None

    def _where(self, scope: set[Thread] | None, owners: Collection[str] | None
               ) -> list[tuple[str, list[str] | None]]:
        """(table, thread tokens or None) to search for SCOPE, or OWNERS' tables."""
        if owners is not None:
            return self._parts.targets_of(owners)
        return self._targets(scope)

    def _targets(self, scope: set[Thread] | None) -> list[tuple[str, list[str] | None]]:
        """(table, thread tokens to filter on, or None for the whole table) to search."""
        if scope is None:
            return [(table, None) for table in self._parts.tables()]
        by_table: dict[str, list[Thread]] = {}
        for thread in scope:
            table = self._parts.known_table(thread)
            if table is not None:
                by_table.setdefault(table, []).append(thread)
        targets = []
        for table, members in sorted(by_table.items()):
            whole = len(members) == self._parts.threads_in(table)
            targets.append((table, None if whole else sorted(thread_token(t) for t in members)))
        return targets

    def _search_table(self, table: str, tokens: list[str] | None, phrases: list[str],
                      wanted: tuple[int, int], window: tuple[float, float] | None,
                      returnable: Callable[[tuple], bool], informative_only: bool = False,
                      senders: list[str] | None = None, required: list[str] | None = None
                      ) -> list[tuple[tuple, tuple, str, str]]:
        """Ranked (or, failing that, newest) matches in one owner's TABLE: the first
        WANTED[0] RETURNABLE ones among the first WANTED[1] matches; none with
        INFORMATIVE_ONLY when every phrase is very common there.  SENDERS: phrases
        one of which the sender must hold; REQUIRED: phrases one of which the text must
        hold (none found there: no match; the rarest of them while they are rare)."""
        rare = self._rarest(table, phrases)
        if not rare and informative_only:
            return []
        words = f"{TEXT}:({' OR '.join(rare or phrases)})"
        if required:
            needed = self._rarest(table, required)
            if not needed and (informative_only or not any(
                    self._frequency(table, phrase) for phrase in required)):
                return []
            words += f" AND {TEXT}:({' OR '.join(needed or required)})"
        match = words if tokens is None else f"thread:({' OR '.join(tokens)}) AND {words}"
        if senders:
            match += f" AND sender:({' OR '.join(senders)})"
        ranked = None
        if rare:       # ranked by the words alone; the threads and senders only filter
            ranked = self._matches(table, words, wanted, True, window, returnable,
                                   time_limit=SEARCH_TIME_LIMIT,
                                   within=None if match == words else match)
            if ranked is not None:
                return [((0, row[1]), row, table, words) for row in ranked]
        newest = self._matches(table, match, wanted, False, window, returnable) or []
        return [((1, -row[0]), row, table, words) for row in newest]

    def _snippets(self, kept: list[tuple[tuple, tuple, str, str]]
                  ) -> dict[int, tuple[str, list[str]]]:
        """rowid -> (snippet with the matched words in brackets, the words matched) for
        the KEPT matches.  The words are read from marks text hardly holds (a bracket
        of the text itself, "[Echo]" or an org link, is no match)."""
        snippets: dict[int, tuple[str, list[str]]] = {}
        for _, (rowid, *_), table, words in kept:    # one seek per row: no full match list
            row = self._db.execute(
                f"SELECT snippet({table}, 0, '[', ']', '…', 12), "
                f"highlight({table}, 0, char(2), char(3)) || ' ' || "
                f"highlight({table}, 3, char(2), char(3)) FROM {table} "
                f"WHERE {table} MATCH ? AND rowid = ?", (words, rowid)).fetchone()
            matched = [] if row is None else list(dict.fromkeys(
                word.lower() for word in _HIGHLIGHTED.findall(row[1])))
            snippets[rowid] = (row[0] if row else "", matched)
        return snippets

    def _rarest(self, table: str, phrases: list[str]) -> list[str]:
        """The rarest of PHRASES in TABLE that together match at most MATCH_BUDGET
        messages (at least one, unless all are very common: then none).

        Very common: in more than COMMON_DOCS messages, or in more than half of
        the table's (where BM25 gives a word no weight: its idf is clamped to ~0)
        and more than WEIGHTLESS_FLOOR (below that, ranking them costs little).
        A phrase found nowhere is left out."""
        counted = sorted((found, n, phrase) for n, phrase in enumerate(phrases)
                         if (found := self._frequency(table, phrase)))
        size = self._size(table, at_least=max((found for found, _, _ in counted), default=0))
        common = _very_common_above(size)
        if any(common < found <= COMMON_DOCS for found, _, _ in counted):
            # the half rule drops a word: judge it on a current count
            common = _very_common_above(self._size(table, fresh=True))
        kept, total = [], 0
        for found, _, phrase in counted:
            if found > common or (kept and total + found > MATCH_BUDGET):
                break
            kept.append(phrase)
            total += found
        return kept

    def _size(self, table: str, at_least: int = 0, fresh: bool = False) -> int:
        """How many messages TABLE holds, counted again after SIZE_TTL seconds, when
        fewer than AT_LEAST (a word found in more messages: the count is stale), or
        when FRESH (a cheap count: FTS5 keeps a row per message in its docsize table)."""
        now = time.monotonic()
        known = self._sizes.get(table)
        if fresh or known is None or now - known[1] > SIZE_TTL or known[0] < at_least:
            size = self._db.execute(f"SELECT count(*) FROM {table}_docsize").fetchone()[0]
            known = self._sizes[table] = (size, now)
        return known[0]

    def _frequency(self, table: str, phrase: str) -> int:
        """In how many messages of TABLE PHRASE occurs, counted up to COMMON_DOCS + 1.

        Counting a frequent word costs time per message, and only its rough size
        matters (to choose the words ranked), so a count of COUNTED_FROM or more is
        reused: once very common, until tables are dropped or emptied (the
        caches are forgotten then); else while the table grew by less than a
        STALE_SHARE-th of it.  Rarer words, and words not found, must be exact (a
        word just said is searched): theirs are reused only while nothing was
        written to the index since (see `_note_state`), as by the several
        searches of one recall ("What did Dev bake last week?" counted "bake"
        six times)."""
        known = self._counts.get((table, phrase))
        if known is not None:
            found, size = known
            if found > COMMON_DOCS or self._size(table) - size < found // STALE_SHARE:
                return found
        rare = self._rare.get((table, phrase))
        if rare is not None:
            return rare
        found = self._db.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT ?)",
            (f"{TEXT}:{phrase}", COMMON_DOCS + 1)).fetchone()[0]
        if found >= COUNTED_FROM:
            if len(self._counts) >= MAX_COUNTS:
                self._counts.clear()
            self._counts[(table, phrase)] = (found, self._size(table, at_least=found))
        else:
            if len(self._rare) >= MAX_COUNTS:
                self._rare.clear()
            self._rare[(table, phrase)] = found
        return found

    def _note_state(self) -> None:
        """Forget the rarer words' counts when the index changed since they were counted:
        another connection committed (SQLite's `data_version` moved) or this one wrote
        (its `total_changes` did)."""
        state = (self._db.execute("PRAGMA data_version").fetchone()[0],
                 self._db.total_changes)
        if state != self._rare_state:
            self._rare.clear()
            self._rare_state = state

    def _joined(self, found: sqlite3.Cursor, count: int) -> Iterator[tuple]:
        """The (rowid, score) pairs FOUND yields, in order, each followed by its
        message's COLUMNS (None when the messages table lacks it), taken COUNT at
        first, then twice as many at a time: only what is taken is read (a search
        passing over the messages of a long context reads its matches as far as
        it goes, not all it might have needed)."""
        size = max(count, 1)
        while chunk := found.fetchmany(size):
            size *= 2
            rows = {row[0]: row[1:] for row in self._db.execute(
                f"SELECT seq, {columns_of('m')} FROM messages m WHERE seq IN "
                f"({', '.join('?' * len(chunk))})", [rowid for rowid, _ in chunk])}
            for rowid, score in chunk:
                yield (rowid, score, *rows.get(rowid, _MISSING))

    def _matches(self, table: str, match: str, wanted: tuple[int, int], ranked: bool,
                 window: tuple[float, float] | None, returnable: Callable[[tuple], bool],
                 time_limit: float | None = None, within: str | None = None
                 ) -> list[tuple] | None:
        """The first WANTED[0] RETURNABLE of the first WANTED[1] matches, best (RANKED)
        or newest first, said within WINDOW if given, each (rowid, score, COLUMNS...)
        with COLUMNS None for a match the messages table lacks; None when TIME_LIMIT
        ran out.  WITHIN: only the messages that match it too (MATCH plus the thread
        and sender filters), read apart.

        Why apart: BM25 counts, once per search, the messages holding each phrase
        of its MATCH, filters included, though they weigh nothing (their columns'
        weight is 0).  "bake AND sender:Dev" counted every message Dev ever sent
        (2.1 ms at 100k messages, a quarter of them Dev's); ranking "bake" among the
        messages that also match the filter, found without ranking, gives the same
        scores and the same rows (0.28 ms).  The filter's messages are a set each
        match is checked against (`+rowid`: not a constraint SQLite may hand the FTS
        table, which would drive the query from the set, one lookup per message, with
        BM25's counts made again for each: "Where does Rosa work now?" took 8.4 ms
        instead of 0.4 at ~5,000 messages).

        Matches are read one by one and only until enough are returnable, so the
        messages ranked past them are never read.  Without a WINDOW the matches
        are ordered in the FTS table alone, then their messages read a few at a
        time (see `_joined`)."""
        count, read = wanted
        score = f"bm25({table}, {BM25_WEIGHTS})"     # the tables' rank, without its lookup
        given = (match,) if within is None else (match, within)

        def only(rowid: str) -> str:
            """The WITHIN condition on ROWID (none without it), a filter only."""
            return "" if within is None else \
                f" AND +{rowid} IN (SELECT rowid FROM {table} WHERE {table} MATCH ?)"
        if time_limit is not None:
            deadline = time.monotonic() + time_limit
            self._db.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        try:
            if window is None:
                with closing(self._db.execute(
                        f"SELECT rowid, {score} AS score FROM {table} WHERE {table} MATCH ?"
                        f"{only('rowid')} ORDER BY {'score' if ranked else 'rowid DESC'} "
                        "LIMIT ?", (*given, read))) as found:
                    return _first(self._joined(found, count), returnable, count)
            sql = (f"SELECT f.rowid, {score} AS score, {columns_of('m')} FROM {table} f "
                   f"JOIN messages m ON m.seq = f.rowid WHERE f.{table} MATCH ?"
                   f"{only('f.rowid')} "
                   f"AND m.epoch >= ? AND m.epoch < ? "
                   f"ORDER BY {'score' if ranked else 'f.rowid DESC'} LIMIT ?")
            with closing(self._db.execute(sql, (*given, *window, read))) as rows:
                return _first(rows, returnable, count)
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


def _very_common_above(size: int) -> int:
    """Found in more messages than this, of an owner's SIZE, a word is very common: more
    than COMMON_DOCS, or more than half of them and than WEIGHTLESS_FLOOR."""
    return min(COMMON_DOCS, max(WEIGHTLESS_FLOOR, size // 2))


def _first(rows: Iterable[tuple], returnable: Callable[[tuple], bool], count: int
           ) -> list[tuple]:
    """The first COUNT of ROWS that are RETURNABLE (ROWS is read no further)."""
    taken = []
    if count <= 0:
        return taken
    for row in rows:
        if returnable(row):
            taken.append(row)
            if len(taken) == count:
                break
    return taken

"""The archive's queries over its index: ranked search, who a question names, neighbours.

`ArchiveQueries` is a part of `Archive` (kept apart for size): the queries read
through `Archive._reading`, a connection of their own (see `readers`), so they
do not wait for the writer's files and fsyncs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager

from opencortex.events import Thread
from opencortex.memory.index import MessageIndex
from opencortex.memory.records import MessageRecord, SearchHit, check_scope, check_unicode

MAX_HITS = 1000              # most search hits returned at once


def check_limit(limit: int) -> int:
    """LIMIT, refused unless a whole number >= 0."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a whole number >= 0, not {limit!r}")
    return limit


class ArchiveQueries:
    """Search for an Archive (which provides `_reading`)."""

    def _reading(self) -> AbstractContextManager[MessageIndex]:
        """The index a query reads (the Archive's)."""
        raise NotImplementedError

    def search(self, query: str, *, thread: Thread | None = None,
               threads: Sequence[Thread] | None = None, limit: int = 10,
               exclude_ids: Collection[str] = (),
               window: tuple[float, float] | None = None,
               snippets: bool = True, candidates: int | None = None,
               owners: Collection[str] | None = None,
               informative_only: bool = False, senders: Collection[str] = (),
               distinct: bool = False, required: str = "") -> list[SearchHit]:
        """Messages matching the words of QUERY, best first (BM25).

        Any word matches (OR); at most 1000 hits.  Scores are -bm25: higher is
        better.  With THREAD and/or THREADS, only messages of those threads (both
        together: their union; an empty THREADS alone: nothing).  With OWNERS
        instead, only messages of the threads `set_partition` gave those owners
        (at a cost that does not grow with their number of threads).  Messages whose
        id is in EXCLUDE_IDS and control records are left out.  Very common words
        are skipped while rarer ones remain (see `MessageIndex.search`).  WINDOW
        (start, end epoch seconds): only messages said in that span.  Without
        SNIPPETS, each hit's snippet is "" (a snippet costs a search of its own).
        CANDIDATES: the first LIMIT hits of a search for that many (fewer read).
        INFORMATIVE_ONLY: nothing when every word is very common (instead of the newest
        matches of those words).  SENDERS: only messages whose sender holds one of
        these words (see `speakers`).  DISTINCT: each text once (bar case and spacing).
        REQUIRED: only messages holding one of these words too (see `MessageIndex.search`).
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be text, not {type(query).__name__}")
        check_unicode(query, "search query")
        scope = check_scope(thread, threads, owners)
        if isinstance(exclude_ids, str):
            raise TypeError("exclude_ids must be a collection of ids, not one string")
        limit = min(check_limit(limit), MAX_HITS)
        if not limit:
            return []
        candidates = min(max(limit, check_limit(candidates or limit)), MAX_HITS)
        with self._reading() as index:
            return index.search(query, scope, limit, exclude_ids, window, snippets=snippets,
                                candidates=candidates, owners=owners,
                                informative_only=informative_only, senders=senders,
                                distinct=distinct, required=required)

    def said_within(self, window: tuple[float, float], *, limit: int = 10,
                    threads: Sequence[Thread] | None = None,
                    owners: Collection[str] | None = None,
                    exclude_ids: Collection[str] = ()) -> list[SearchHit]:
        """The newest LIMIT messages of THREADS (or of OWNERS' threads, as in `search`)
        said within WINDOW (start, end epoch seconds), whatever their words."""
        scope = check_scope(None, threads, owners)
        with self._reading() as index:
            return index.said_within(window, check_limit(limit), scope, owners, exclude_ids)

    def speakers(self, query: str, *, threads: Sequence[Thread] | None = None,
                 owners: Collection[str] | None = None) -> list[str]:
        """The words of QUERY that name a sender in THREADS (or of OWNERS' threads, as
        in `search`): "What did Caroline say" -> ["Caroline"] when Caroline wrote there."""
        check_unicode(query, "search query")
        scope = check_scope(None, threads, owners)
        with self._reading() as index:
            return index.speakers(query, scope, owners)

    def undelivered(self, message_ids: Iterable[str]) -> set[str]:
        """Those of MESSAGE_IDS that were written but never reached the person: marked so
        when written, or by the control record that followed them (see
        `opencortex.conversation.delivery`)."""
        with self._reading() as index:
            return index.undelivered(message_ids)

    def neighbours(self, message_id: str) -> tuple[MessageRecord | None, MessageRecord | None]:
        """The messages just before and after MESSAGE_ID in its thread (None: none)."""
        return self.neighbours_of([message_id]).get(message_id, (None, None))

    def neighbours_of(self, message_ids: Iterable[str], *, after_of: Iterable[str] | None = None,
                      before_with: Iterable[str] | None = None
                      ) -> dict[str, tuple[MessageRecord | None, MessageRecord | None]]:
        """`neighbours` of each of MESSAGE_IDS, read together (an unknown id is left
        out); the message after only for the ids in AFTER_OF (default: all), the one
        before (with BEFORE_WITH) only when its text holds one of BEFORE_WITH."""
        with self._reading() as index:
            return index.neighbours_of(message_ids, after_of=after_of, before_with=before_with)

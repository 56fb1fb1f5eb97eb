"""A thread's messages read a bounded piece at a time: by their place in the file, or by time.

`ThreadTimeline` is a part of `MessageIndex` (kept apart for size).  Its
queries never hand back a whole thread: `records_before` pages through a
thread newest first (a checkpoint worked out by counting, see
`conversation.checkpointscan`); `bridged_span` sums up what a bridge archived
of a thread, and `said_between` finds what it archived within seconds of a
time (see `memory.bridged`); `said_within` the newest messages of threads said
in a period (recall's "what did we talk about yesterday?").  All of them by time
read through the index on (thread, time), TIME_INDEX.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection

from opencortex.events import Thread
from opencortex.memory.records import MessageRecord, SearchHit
from opencortex.memory.rows import (COLUMNS, IMPORTED, NOT_CONTROL, PLATFORM_ID, columns_of,
                                    record_fields)

TIME_INDEX = "messages_in_time"
TIME_INDEX_SQL = f"CREATE INDEX IF NOT EXISTS {TIME_INDEX} ON messages (channel, chat_id, epoch)"
CHECKED_THREADS = 256   # threads `_said_any_within` looks at, at most (one seek each)
# A conversation message as `conversation.branches.is_control` tells it: not a control record.
CONVERSATION = f"(role != 'system' OR {NOT_CONTROL})"
# Messages a bridge archived as they came: not brought in by `memory import`.
NOT_IMPORTED = f"json_extract(extra, '$.{IMPORTED}') IS NULL"


class ThreadTimeline:
    """Paged and timed reads of one thread for a MessageIndex (which provides `_db`)."""

    _db: sqlite3.Connection

    def records_before(self, thread: Thread, before: int | None, limit: int
                       ) -> list[tuple[int, MessageRecord]]:
        """(offset, record) of the LIMIT messages of THREAD just before file offset BEFORE
        (None: the end of its file), newest first."""
        bound = "" if before is None else "AND offset < ? "
        rows = self._db.execute(
            f"SELECT offset, {COLUMNS} FROM messages WHERE channel = ? AND chat_id = ? "
            f"{bound}ORDER BY offset DESC LIMIT ?",
            (*thread, *(() if before is None else (before,)), limit)).fetchall()
        return [(row[0], MessageRecord.model_construct(**record_fields(row[1:])))
                for row in rows]

    def first_message_id(self, thread: Thread) -> str | None:
        """The id of THREAD's first conversation message (control records aside)."""
        row = self._db.execute(
            f"SELECT id FROM messages WHERE channel = ? AND chat_id = ? AND {CONVERSATION} "
            "ORDER BY offset LIMIT 1", tuple(thread)).fetchone()
        return None if row is None else row[0]

    def bridged_span(self, thread: Thread) -> tuple[float, float, frozenset[str]] | None:
        """(first, last time, the senders of its people's messages) of THREAD's
        conversation messages a bridge archived (not imported); None: it has none."""
        rows = self._db.execute(
            f"SELECT min(epoch), max(epoch), role, sender FROM messages WHERE channel = ? "
            f"AND chat_id = ? AND {CONVERSATION} AND {NOT_IMPORTED} GROUP BY role, sender",
            tuple(thread)).fetchall()
        if not rows:
            return None
        people = frozenset(sender for _, _, role, sender in rows if role == "user" and sender)
        return min(row[0] for row in rows), max(row[1] for row in rows), people

    def said_between(self, thread: Thread, start: float, end: float, roles: tuple[str, ...],
                     sender: str | None = None, *, platform_ids: bool = True
                     ) -> list[tuple[str, str, str, float]]:
        """(id, role, text, time) of THREAD's conversation messages a bridge archived (not
        imported) between START and END (epoch seconds, both included), of ROLES, and of
        SENDER when given; without PLATFORM_IDS, only those without a PLATFORM_ID."""
        marks = ", ".join("?" * len(roles))
        who = "" if sender is None else "AND sender = ? "
        ids = "" if platform_ids else f"AND json_extract(extra, '$.{PLATFORM_ID}') IS NULL "
        return self._db.execute(
            f"SELECT id, role, text, epoch FROM messages INDEXED BY {TIME_INDEX} "
            f"WHERE channel = ? AND chat_id = ? AND epoch BETWEEN ? AND ? AND role IN "
            f"({marks}) {who}{ids}AND {CONVERSATION} AND {NOT_IMPORTED}",
            (*thread, start, end, *roles, *(() if sender is None else (sender,)))).fetchall()

    def said_within(self, window: tuple[float, float], limit: int,
                    threads: Collection[Thread] | None = None,
                    owners: Collection[str] | None = None,
                    exclude_ids: Collection[str] = ()) -> list[SearchHit]:
        """The newest LIMIT messages of THREADS (or of OWNERS' threads) said within
        WINDOW (start, end epoch seconds), whatever their words: "what did we talk
        about yesterday" asks for those.  Control records are never returned."""
        scope, names = _scope_sql(threads, owners)
        if not names or limit <= 0:
            return []
        rows = self._db.execute(
            f"SELECT {columns_of('m')} FROM messages m WHERE ({scope}) AND m.epoch >= ? "
            f"AND m.epoch < ? AND {NOT_CONTROL} ORDER BY m.epoch DESC LIMIT ?",
            (*names, *window, limit + len(exclude_ids))).fetchall()
        hits = [SearchHit(**record_fields(row), score=0.0, snippet="", matched=[])
                for row in rows]
        return [hit for hit in hits if hit.id not in exclude_ids][:limit]

    def _said_any_within(self, window: tuple[float, float],
                         threads: Collection[Thread] | None,
                         owners: Collection[str] | None) -> bool:
        """Whether anything of THREADS (all: None), or of OWNERS' threads, was said within
        WINDOW: a seek per thread in the index on time.  (Searching a period nothing was
        said in otherwise ranks every match of the words only to keep none of them:
        40 ms at 100k messages.)  True without looking for all threads, or more than
        CHECKED_THREADS: the look would cost more than it may save."""
        if owners is None and (threads is None or len(threads) > CHECKED_THREADS):
            return True
        scope, names = _scope_sql(threads, owners)
        return bool(names) and self._db.execute(
            f"SELECT 1 FROM messages m WHERE ({scope}) AND m.epoch >= ? AND m.epoch < ? "
            "LIMIT 1", (*names, *window)).fetchone() is not None


def _scope_sql(threads: Collection[Thread] | None, owners: Collection[str] | None
               ) -> tuple[str, list[str]]:
    """SQL selecting messages m of THREADS, or of OWNERS' threads, and its parameters
    (none: nothing is in scope)."""
    if owners is not None:
        names = sorted(set(owners))
        return (f"(m.channel, m.chat_id) IN (SELECT channel, chat_id FROM thread_parts "
                f"WHERE part IN ({', '.join('?' * len(names))}))"), names
    listed = sorted({tuple(thread) for thread in threads or ()})
    if not listed:
        return "", []
    return ("(m.channel, m.chat_id) IN (SELECT json_extract(value, '$[0]'), "
            "json_extract(value, '$[1]') FROM json_each(?))",
            [json.dumps(listed)])                  # one parameter, however many threads

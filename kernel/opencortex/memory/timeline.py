"""A thread's messages read a bounded piece at a time: by their place in the file, or by time.

`ThreadTimeline` is a part of `MessageIndex` (kept apart for size).  Its
queries never hand back a whole thread: `records_before` pages through a
thread newest first (a checkpoint worked out by counting, see
`conversation.checkpointscan`); `bridged_span` sums up what a bridge archived
of a thread, and `said_between` finds what it archived within seconds of a
time, through an index on (thread, time) that `ensure_time_index` makes when
an import first needs it (see `memory.bridged`).
"""
from __future__ import annotations

import sqlite3

from opencortex.events import Thread
from opencortex.memory.records import MessageRecord
from opencortex.memory.rows import COLUMNS, IMPORTED, NOT_CONTROL, PLATFORM_ID, record_fields

TIME_INDEX = "messages_in_time"
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

    def ensure_time_index(self) -> None:
        """Make the index on (thread, time) `said_between` reads, if it is not there yet
        (once per index: a rebuilt index has none until it is needed again)."""
        self._db.execute(f"CREATE INDEX IF NOT EXISTS {TIME_INDEX} "
                         "ON messages (channel, chat_id, epoch)")

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

"""A thread's messages read a bounded piece at a time: by their place in the file, or by time.

`ThreadTimeline` is a part of `MessageIndex` (kept apart for size).  Its
queries never hand back a whole thread: `records_before` pages through a
thread newest first (a checkpoint worked out by counting, see
`conversation.checkpointscan`), and `said_between` finds what was said in a
few seconds of one thread through an index on (thread, time) that
`ensure_time_index` makes when an import first needs it (see
`memory.bridged`).
"""

from __future__ import annotations

import sqlite3

from opencortex.events import Thread
from opencortex.memory.records import MessageRecord
from opencortex.memory.rows import COLUMNS, record_fields

TIME_INDEX = "messages_in_time"
# A conversation message as `conversation.branches.is_control` tells it: not a control record.
CONVERSATION = "(role != 'system' OR json_extract(extra, '$.CONTROL') IS NULL)"
# Messages a bridge archived as they came: not brought in by `memory import`.
NOT_IMPORTED = "json_extract(extra, '$.IMPORTED') IS NULL"


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

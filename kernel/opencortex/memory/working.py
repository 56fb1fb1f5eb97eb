"""Working memory only: threads of a channel configured with `archive = false`.

A bridge can be kept out of the org archive and the search index (`[bridges.NAME]
archive = false`).  Its threads still need a log for the working context,
branches and commands, so `WorkingMemory` offers the two calls the thread log
makes of the archive — `thread_records` and `append` — and keeps the records in
this process only, at most `limit` per thread (the oldest are forgotten).
Nothing is written to disk; a restart forgets it all.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from opencortex.events import Thread
from opencortex.ids import random_uuid
from opencortex.memory.records import MessageRecord, NewMessage, check_thread
from opencortex.memory.rows import CONTROL_KEY, DELIVERY, FAILED

THREAD_LIMIT = 2000   # records kept per thread


class WorkingMemory:
    """Messages kept in memory, by thread, never on disk."""

    def __init__(self, limit: int = THREAD_LIMIT):
        self.limit = limit
        self._threads: dict[Thread, list[MessageRecord]] = {}
        self._undelivered: set[str] = set()        # ids of kept messages never delivered

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """Every message still kept for THREAD, oldest first."""
        return list(self._threads.get(check_thread(thread), ()))

    def history(self, thread: Thread, limit: int = 20) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first."""
        return self.thread_records(thread)[-limit:] if limit else []

    def undelivered(self, message_ids: Iterable[str]) -> set[str]:
        """Those of MESSAGE_IDS the person never got, as `Archive.undelivered` tells."""
        return self._undelivered.intersection(message_ids)

    def append(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """Keep MESSAGES (one turn); PARENT "auto" links each to the one before it."""
        batch = [m if isinstance(m, NewMessage) else NewMessage.model_validate(m)
                 for m in messages]
        now, records = time.time(), []
        for message in batch:
            kept = self._threads.setdefault(message.thread, [])
            parent = message.parent if message.parent != "auto" else \
                (kept[-1].id if kept else None)
            record = MessageRecord(
                id=str(random_uuid()), role=message.role, text=message.text,
                channel=message.thread.channel, chat_id=message.thread.chat_id,
                sender=message.sender, parent=parent, turn_type=message.turn_type,
                timestamp=now if message.timestamp is None else message.timestamp,
                extra=dict(message.extra))
            if _marks_undelivered(record, kept[-1] if kept else None):
                self._undelivered.add(record.extra.get("TARGET", record.id))
            kept.append(record)
            forgotten = max(0, len(kept) - self.limit)
            self._undelivered.difference_update(old.id for old in kept[:forgotten])
            del kept[:forgotten]
            records.append(record)
        return records


def _marks_undelivered(record: MessageRecord, before: MessageRecord | None) -> bool:
    """Whether RECORD says a message was never delivered: itself (a message carrying
    DELIVERY failed), or BEFORE, the message it directly follows (a control record
    saying so of BEFORE; its TARGET)."""
    if record.extra.get(DELIVERY) != FAILED:
        return False
    if CONTROL_KEY not in record.extra:
        return True
    return before is not None and CONTROL_KEY not in before.extra and \
        record.extra.get("TARGET") == before.id

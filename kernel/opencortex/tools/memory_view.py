"""`OwnerMemory`: the archive as one owner may see it, for tools (`ctx.memory`).

Built per tool call by the tool actuator for the event's thread::

    OwnerMemory.of(conversations, event.thread)
    # same as OwnerMemory(conversations.recall, event.thread,
    #                     conversations.store_for(event.thread))

- `search(query, limit)` is recall's own search (`Recall.hits`): the owner's
  threads only (plus owners configured as shared), each owner ranked with
  its own word statistics, dates in the query searched first, every hit's
  owner checked again.  Never another owner's messages.  Unlike recall, a query
  of only very common words finds their newest matches (a search was asked for).
- `messages(since, until, limit)` is the asking thread's own messages in a
  time span, oldest first, without the kernel's bookkeeping (control records,
  system errors) — from the archive, or from working memory for a channel
  kept out of the archive.

A reply the person never got (see `conversation.delivery`) is returned with
`delivered` false and its text behind NOT_DELIVERED, as the working context
and recall show it.

Both read SQLite and files: call them off the event loop (`asyncio.to_thread`).
The index connection and the archive's lock allow that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from opencortex.conversation.branches import is_control
from opencortex.conversation.delivery import as_seen
from opencortex.conversation.recall import Recall
from opencortex.events import Thread
from opencortex.memory import MessageRecord

MAX_SEARCH = 20        # most hits one search returns
MAX_MESSAGES = 500     # most messages one `messages` call returns


class ThreadStore(Protocol):
    """Where a thread's messages are kept: the Archive or WorkingMemory."""

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """Every message of THREAD in file order."""

    def undelivered(self, message_ids: Iterable[str]) -> set[str]:
        """Those of MESSAGE_IDS the person never got."""


def shown(record: MessageRecord) -> bool:
    """Whether a tool may show RECORD: no control records and no system errors
    (tool results and approval outcomes are shown, as in the working context)."""
    if is_control(record):
        return False
    return record.role != "system" or record.turn_type in ("action", "yield")


def as_dict(record: MessageRecord, score: float | None = None, *,
            delivered: bool = True) -> dict[str, Any]:
    """RECORD as the plain dict `OwnerMemory` returns (DELIVERED: whether the person
    got it)."""
    found = {"id": record.id, "thread": str(record.thread), "role": record.role,
             "text": as_seen(record.text, not delivered), "timestamp": record.timestamp,
             "delivered": delivered}
    if score is not None:
        found["score"] = score
    return found


def _limit(limit: int, most: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a whole number >= 0, not {limit!r}")
    return min(limit, most)


class OwnerMemory:
    """The memory a tool may see in THREAD's turn: its owner's, no one else's."""

    def __init__(self, recall: Recall, thread: Thread, store: ThreadStore | None = None):
        """RECALL: the kernel's (`Conversations.recall`), which knows the owners;
        STORE: where THREAD's messages are kept (default: recall's archive)."""
        self.recall = recall
        self.thread = Thread(*thread)
        self.store = store if store is not None else recall.archive

    @classmethod
    def of(cls, conversations: Any, thread: Thread) -> OwnerMemory:
        """The view for THREAD from the kernel's `Conversations`."""
        return cls(conversations.recall, thread, conversations.store_for(thread))

    @property
    def owner(self) -> str:
        """Whose memory this is."""
        return self.recall.owner(self.thread)

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        """The owner's messages best matching QUERY, best first (as recall finds them)."""
        limit = _limit(limit, MAX_SEARCH)
        if not isinstance(query, str):
            raise TypeError(f"query must be text, not {type(query).__name__}")
        hits, _ = self.recall.hits(self.thread, query, k=limit, informative_only=False)
        allowed = {self.owner, *self.recall.shared_owners}
        hits = [hit for hit in hits
                if hit.thread == self.thread or self.recall.owner(hit.thread) in allowed]
        gone = self.recall.archive.undelivered([hit.id for hit in hits]) if hits else set()
        return [as_dict(hit, hit.score, delivered=hit.id not in gone) for hit in hits]

    def messages(self, since: float | None = None, until: float | None = None,
                 limit: int = 50) -> list[dict[str, Any]]:
        """This thread's messages said at SINCE or later and before UNTIL (Unix
        times; None: unbounded), oldest first, the first LIMIT of them."""
        limit = _limit(limit, MAX_MESSAGES)
        if since is not None and until is not None and until <= since:
            return []
        found = [record for record in self.store.thread_records(self.thread)
                 if (since is None or record.timestamp >= since)
                 and (until is None or record.timestamp < until) and shown(record)]
        found.sort(key=lambda record: record.timestamp)      # imports may be out of order
        found = found[:limit]
        gone = self.store.undelivered([record.id for record in found]) if found else set()
        return [as_dict(record, delivered=record.id not in gone) for record in found]

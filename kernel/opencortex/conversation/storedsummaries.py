"""Summary records: the summaries compression made, kept in the thread's org file.

When the working context folds messages into a summary (strategies
``summarize`` and ``galois``), the summary is appended to the thread's file
as a record of its own, so a restart puts it back instead of asking the
summarizer again.  It is a control record (see `branches`): search, recall,
turns and history never show it as something someone said::

    * system [2026-11-23 Mon 10:02]
    :PROPERTIES:
    :ROLE:     system
    :PARENT:
    :TURN_TYPE: silence
    :CONTROL:  summary
    :BRANCH:   main
    :STRATEGY: summarize
    :TURNS:    2-40
    :FIRST:    <id of the first message it covers>
    :LAST:     <id of the last message it covers>
    :KEPT:     <ids of the messages between them pinned then, if any>
    :END:
    [Summary of turns 2-40] user (turn 2): …

A summary covers the messages of its branch from FIRST to LAST except pinned
ones (which are never folded: KEPT names them, so one unpinned since is not
taken for covered) and those dropped as small talk: after a restart the
context is the pins and the messages KEPT, the summary, then the messages
after LAST.
A record lacking any of these properties is ignored (not fatal); a torn one
never reaches a reader (see `memory.completeness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opencortex.conversation.branches import BRANCH, CONTROL
from opencortex.conversation.entries import Entry
from opencortex.events import Thread
from opencortex.memory import MessageRecord, NewMessage

SUMMARY = "summary"           # the CONTROL kind of a summary record
STRATEGY, TURNS, FIRST, LAST, KEPT = "STRATEGY", "TURNS", "FIRST", "LAST", "KEPT"
ID_PREFIX = "summary:"        # context entry ids of summaries


@dataclass(frozen=True)
class StoredSummary:
    """One summary record, read back."""

    record_id: str
    text: str
    strategy: str
    turns: str                # e.g. "2-40" or "7"
    first: str                # id of the first message covered
    last: str                 # id of the last message covered
    kept: tuple[str, ...] = ()   # ids between them left out, pinned when it was made
    branch: str = ""             # the branch it summarizes

    @property
    def first_turn(self) -> int:
        """The first turn number the summary covers (0 when unknown)."""
        head = self.turns.split("-", 1)[0]
        return int(head) if head.isdigit() else 0

    @property
    def entry_id(self) -> str:
        """The id of the context entry that stands for this record."""
        return ID_PREFIX + self.record_id


def is_summary(record: MessageRecord | NewMessage) -> bool:
    """True for a summary record."""
    return record.role == "system" and record.extra.get(CONTROL) == SUMMARY


def summary_message(thread: Thread, entry: Entry, *, strategy: str, branch: str,
                    turns: str, kept: Sequence[str] = ()) -> NewMessage:
    """The record that keeps summary ENTRY (its covers oldest first) of BRANCH; KEPT:
    the pinned messages it left out between them."""
    if entry.kind != "summary" or not entry.covers:
        raise ValueError("only a summary entry that covers messages can be stored")
    extra = {CONTROL: SUMMARY, BRANCH: branch, STRATEGY: strategy, TURNS: turns or "0",
             FIRST: entry.covers[0], LAST: entry.covers[-1],
             **({KEPT: " ".join(kept)} if kept else {})}
    return NewMessage(role="system", text=entry.text, thread=thread, turn_type="silence",
                      parent=None, extra=extra)


def stored_summary(record: MessageRecord) -> StoredSummary | None:
    """The summary RECORD keeps; None when it is not one or lacks what a restore needs."""
    if not is_summary(record):
        return None
    values = [record.extra.get(key, "") for key in (STRATEGY, TURNS, FIRST, LAST)]
    if not all(values) or not record.text:
        return None
    strategy, turns, first, last = values
    kept = tuple(record.extra.get(KEPT, "").split())
    return StoredSummary(record.id, record.text, strategy, turns, first, last, kept,
                         record.extra.get(BRANCH, ""))


def restored_entry(summary: StoredSummary, covers: tuple[str, ...]) -> Entry:
    """The context entry for SUMMARY; COVERS are the covered ids known (oldest first)."""
    ids = tuple(dict.fromkeys((summary.first, *covers, summary.last)))
    return Entry(id=summary.entry_id, role="system", text=summary.text,
                 turn=summary.first_turn, retention="REQUIRED", kind="summary", covers=ids)

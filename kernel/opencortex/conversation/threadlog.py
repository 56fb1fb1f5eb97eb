"""A thread's messages as a graph of PARENT pointers, with named branches and a head.

`ThreadLog.load` reads the thread once and replays it: conversation records
become nodes of the graph, control records (see `branches`) rebuild the
branch tips, the current branch, the pins and the compression strategy, and
summary records (see `storedsummaries`) are kept for the working context.
Every later change is written to the archive first and then applied to memory
by the same replay step, so a fresh `load` after a restart always gives the same state.
After loading, nothing here reads the archive again: `ancestors` walks an
in-memory map and the current branch's path is cached and extended as turns
are appended.

`ThreadLog.resume` opens a thread from the tail of its org file instead (see
`resume`): the newest checkpoint gives the state, the tail the newest part of
the current branch, so opening costs what the working context needs, not the
length of the thread.  Such a log is *partial*: what needs more of the graph
(other branches, old turns, fork, rewind, switch, merge) first makes it whole
with one `load`.

A turn is a user message and everything after it up to the next user message
(messages before the first user message form turn 1 on their own).  Use one
ThreadLog per thread per process; messages other code appends to the same
thread are seen on the next `load` (and a log that notices such a write
stops writing checkpoints, so a resume never trusts its view).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

from opencortex.conversation.branches import BranchState, is_control
from opencortex.conversation.branchops import BranchOps
from opencortex.conversation.checkpoint import ContextMark
from opencortex.conversation.delivery import delivery_mark
from opencortex.conversation.entries import Entry, default_retention
from opencortex.conversation.resumable import Resumable, SinceCheckpoint
from opencortex.conversation.storedsummaries import StoredSummary
from opencortex.conversation.turns import Turn, record_tokens
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, NewMessage
from opencortex.memory.records import check_thread

SUMMARIES_KEPT = 16      # newest summary records kept in memory
NEAR_HEAD = 1000         # messages near the head searched before walking the whole graph


class UnknownMessage(KeyError, ValueError):
    """No conversation message with that id in this thread."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown message"


class ThreadLog(Resumable, BranchOps):
    """One thread's messages as a graph (PARENT pointers) with branches and a head."""

    def __init__(self, archive: Archive, thread: Thread):
        """An empty log; use `ThreadLog.load` or `resume` to read a thread's history."""
        self.archive = archive
        self.thread = check_thread(thread)
        self._records: dict[str, MessageRecord] = {}     # conversation records only
        self._parent: dict[str, str | None] = {}         # effective parent of each record
        self._controls: set[str] = set()                 # ids of control records
        self._state = BranchState()
        self._path: list[str] = []                       # (root or oldest loaded) .. _path_head
        self._path_head: str | None = None
        self._turn_starts: list[int] = []                # indexes into _path where turns begin
        self._turn_base = 0                              # turns begun before _path[0] (partial)
        self._head_tokens = 0                            # TOKENS_IN + TOKENS_OUT up to the head
        self._summaries: deque[StoredSummary] = deque(maxlen=SUMMARIES_KEPT)
        self._newest_summary: dict[str, str] = {}        # branch -> its newest summary's id
        self._last_seen: str | None = None               # newest entry of the file applied
        self._first_message: str | None = None           # oldest conversation message
        self._partial = False                            # resumed from the tail of the file
        self._rooted = True                              # _path starts at the branch's root
        self._off_path: set[str] = set()                 # partial: loaded, known off the branch
        self._stale = False                              # another writer was noticed
        self._in_flight: tuple | None = None             # (future, apply) of a pending write
        self._checkpointed: MessageRecord | None = None  # carries the newest checkpoint
        self._since: SinceCheckpoint | None = None       # what came after it
        self._file = archive.thread_file(self.thread) if isinstance(archive, Archive) else None

    @classmethod
    def load(cls, archive: Archive, thread: Thread) -> ThreadLog:
        """Read THREAD once (from the index, kept in step with its org file) and rebuild
        its graph, branches, head and pins."""
        log = cls(archive, thread)
        for record in archive.thread_records(log.thread):
            log._apply(record)
        return log

    # -- replay ----------------------------------------------------------

    def _apply(self, record: MessageRecord) -> None:
        """Take one archived record (in file order) into the in-memory state."""
        if record.id in self._records or record.id in self._controls:
            return
        self._last_seen = record.id
        self._note_checkpoint(record)
        if is_control(record):
            self._controls.add(record.id)
            if not self._keep_summary(record):
                self._state.apply_control(record)
            self._note_since(record)
            return
        if self._first_message is None:
            self._first_message = record.id
        parent = record.parent
        if parent is not None and parent not in self._records:
            # Written with an "auto" parent right after a control record (or after an
            # entry since moved aside): it continues the current branch.
            parent = self._state.head
        self._records[record.id] = record
        self._parent[record.id] = parent
        moved = self._state.advance(parent, record.id)
        if moved == self._state.current and parent == self._path_head:
            self._extend_path(record)

    def _extend_path(self, record: MessageRecord) -> None:
        """The head moved one message on: extend the cached path instead of rebuilding it."""
        if record.role == "user" or (not self._path and not self._turn_base):
            self._turn_starts.append(len(self._path))
        self._path.append(record.id)
        self._path_head = record.id
        self._head_tokens += record_tokens(record)

    # -- state -----------------------------------------------------------

    @property
    def head(self) -> str | None:
        """The id of the newest message on the current branch (None when it is empty)."""
        return self._state.head

    @property
    def branch(self) -> str:
        """The current branch's name ("main" first)."""
        return self._state.current

    def branches(self) -> dict[str, str | None]:
        """Branch name -> tip id, in order of creation (None only for an empty branch)."""
        self._complete()
        return dict(self._state.tips)

    def pins(self) -> set[str]:
        """The ids of the pinned messages."""
        return set(self._state.pins)

    @property
    def strategy(self) -> str | None:
        """The compression strategy chosen for this thread (None: the configured one)."""
        return self._state.strategy

    def branch_summaries(self) -> list[dict[str, Any]]:
        """Each branch in order of creation: {"name", "head_turn" (the turn its head
        is in, 0 when empty), "turns" (how many it has: the same number), "current",
        "head" (the head's message id or None)}.  Costs one walk per branch."""
        self._complete()
        out = []
        for name, tip in self._state.tips.items():
            path = self._walk(tip)
            turns = sum(1 for i, mid in enumerate(path)
                        if i == 0 or self._records[mid].role == "user")
            out.append({"name": name, "head_turn": turns, "turns": turns,
                        "current": name == self.branch, "head": tip})
        return out

    def record(self, message_id: str) -> MessageRecord:
        """The conversation message MESSAGE_ID of this thread (UnknownMessage otherwise)."""
        if message_id not in self._records:
            self._complete()
        try:
            return self._records[message_id]
        except KeyError:
            raise UnknownMessage(f"there is no message {message_id!r} in {self.thread}") from None

    def __len__(self) -> int:
        """How many conversation messages the thread holds, on all branches."""
        self._complete()
        return len(self._records)

    # -- the current branch's path -----------------------------------------

    def _current_path(self) -> list[str]:
        """Ids from the root to the head; cached, rebuilt only after the head jumped.
        (A partial log holds only the newest part: `_turn_base` turns precede it.)"""
        if self._state.head != self._path_head:
            self._complete()
        head = self._state.head
        if head != self._path_head:
            self._path = self._walk(head)
            self._turn_starts = [i for i, mid in enumerate(self._path)
                                 if i == 0 or self._records[mid].role == "user"]
            self._turn_base = 0
            self._head_tokens = sum(record_tokens(self._records[mid]) for mid in self._path)
            self._path_head = head
        return self._path

    def _whole_path(self, wanted: int | None) -> list[str]:
        """The current path, made whole first unless its newest WANTED ids are loaded."""
        path = self._current_path()
        if not self._rooted and (wanted is None or wanted > len(path)):
            self._complete()
            path = self._current_path()
        return path

    def _walk(self, message_id: str | None) -> list[str]:
        """Ids from the root to MESSAGE_ID, oldest first (bounded by the number of records)."""
        path: list[str] = []
        here = message_id
        for _ in range(len(self._records) + 1):
            if here is None:
                break
            path.append(here)
            here = self._parent[here]
        path.reverse()
        return path

    def ancestors(self, message_id: str | None = None, *,
                  limit: int | None = None) -> list[MessageRecord]:
        """The causal past of the head (or MESSAGE_ID), itself included, oldest first.

        Only conversation records; LIMIT keeps just the newest LIMIT of them.
        """
        if message_id is None or message_id == self.head:
            path = self._whole_path(limit)
        else:
            self._complete()
            self.record(message_id)
            path = self._walk(message_id)
        if limit is not None:
            path = path[max(0, len(path) - limit):]
        return [self._records[mid] for mid in path]

    def turn_count(self) -> int:
        """How many turns the current branch has."""
        self._current_path()
        return self._turn_base + len(self._turn_starts)

    def head_tokens(self) -> int:
        """TOKENS_IN + TOKENS_OUT written on the current branch's records."""
        self._current_path()
        return self._head_tokens

    def turns(self) -> list[Turn]:
        """The turns of the current branch, numbered 1..N."""
        path = self._whole_path(None)
        return [self._turn_at(n, path) for n in range(1, len(self._turn_starts) + 1)]

    def turn(self, number: int) -> Turn:
        """Turn NUMBER of the current branch (ValueError when there is none)."""
        path = self._current_path()
        count = self.turn_count()
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
            raise ValueError(f"there is no turn {number} (this branch has {count})")
        if number <= self._turn_base:
            path = self._whole_path(None)
        return self._turn_at(number, path)

    def _turn_at(self, number: int, path: list[str]) -> Turn:
        index = number - self._turn_base - 1
        start = self._turn_starts[index]
        end = self._turn_starts[index + 1] if index + 1 < len(self._turn_starts) else len(path)
        records = [self._records[mid] for mid in path[start:end]]
        if records[0].role == "user":
            return Turn(number, records[0], records[1:])
        return Turn(number, None, records)

    def last_turns(self, count: int) -> list[Turn]:
        """The newest COUNT turns of the current branch (all when it has fewer)."""
        total = self.turn_count()
        return [self.turn(n) for n in range(max(1, total - count + 1), total + 1)]

    def position(self, message_id: str, *, within: int) -> int | None:
        """How many messages follow MESSAGE_ID on the current branch, when it is one of
        the newest WITHIN (None otherwise, or when the log does not hold them)."""
        path = self._current_path()
        for back in range(min(within, len(path))):
            if path[-1 - back] == message_id:
                return back
        return None

    def recent_ids(self, count: int) -> list[str]:
        """The ids of the newest COUNT messages of the current branch the log holds."""
        path = self._current_path()
        return path[max(0, len(path) - count):]

    def turn_of(self, message_id: str) -> int | None:
        """The number of the current branch's turn holding MESSAGE_ID (None when off it)."""
        path = self._current_path()
        back = self.position(message_id, within=len(path) if self._partial else NEAR_HEAD)
        if back is None and self._partial:
            if message_id in self._off_path:
                return None
            self._complete()
            path = self._current_path()
        if back is None:
            self.record(message_id)
            # Positions on the path are found by walking up from the message (it may be deep).
            depth = len(self._walk(message_id)) - 1
            if depth >= len(path) or path[depth] != message_id:
                return None
            return bisect.bisect_right(self._turn_starts, depth)
        return self._turn_base + bisect.bisect_right(self._turn_starts, len(path) - 1 - back)

    def entries(self, *, limit: int | None = None) -> list[Entry]:
        """The current branch as Entries (pinned ones PRESERVED), oldest first.

        LIMIT keeps only the newest LIMIT messages; the cost follows LIMIT, not
        the length of the thread.
        """
        path = self._whole_path(limit)
        first = 0 if limit is None else max(0, len(path) - limit)
        return [self._entry(path, index) for index in range(first, len(path))]

    def entries_of(self, message_ids: Collection[str]) -> list[Entry]:
        """Those of MESSAGE_IDS on the current branch as Entries (pinned ones PRESERVED),
        in the branch's order and with their turn numbers (the branch is read whole)."""
        wanted = set(message_ids)
        if not wanted:
            return []
        path = self._whole_path(None)
        return [self._entry(path, index) for index, mid in enumerate(path) if mid in wanted]

    def _entry(self, path: list[str], index: int) -> Entry:
        """The Entry of the message at INDEX of the current branch's PATH."""
        record = self._records[path[index]]
        retention = ("PRESERVED" if record.id in self._state.pins
                     else default_retention(record.role, record.text, record.turn_type))
        return Entry(id=record.id, role=record.role, text=record.text,
                     turn=self._turn_base + bisect.bisect_right(self._turn_starts, index),
                     turn_type=record.turn_type, retention=retention)

    # -- writing ----------------------------------------------------------

    def mark_undelivered(self, message_id: str, why: str) -> MessageRecord:
        """Archive that MESSAGE_ID, written, never reached the person (WHY: what the
        platform said); see `delivery`.  Written right after its turn."""
        return self._write([delivery_mark(self.thread, message_id, self.branch, why)])[0]

    def append_turn(self, messages: Sequence[NewMessage], *, checkpoint: bool = False,
                    context: ContextMark | None = None) -> list[MessageRecord]:
        """Archive MESSAGES (one turn) after the head in one write; the head moves to the last.

        With CHECKPOINT, the last reply of the turn carries the log's state before
        the write (see `checkpoint`), and CONTEXT where the working context started
        then, so a restart can resume from the file's tail with the same context.
        """
        return self._write(self._chained(messages, checkpoint, context))

    async def append_turn_async(self, messages: Sequence[NewMessage], *,
                                checkpoint: bool = False,
                                context: ContextMark | None = None) -> list[MessageRecord]:
        """`append_turn` written by the archive's writer thread, in a group commit: the
        log takes the records (and the head moves) once they are durable."""
        await self._landed()
        return await self._write_async(self._chained(messages, checkpoint, context))

    def _chained(self, messages: Sequence[NewMessage], checkpoint: bool,
                 context: ContextMark | None) -> list[NewMessage]:
        """MESSAGES checked and linked after the head, the checkpoint on the last reply."""
        batch = list(messages)
        if not batch:
            raise ValueError("a turn needs at least one message")
        for message in batch:
            if not isinstance(message, NewMessage):
                raise TypeError(f"expected NewMessage, not {type(message).__name__}")
            if message.thread != self.thread:
                raise ValueError(f"message for {message.thread} given to the log of {self.thread}")
            if is_control(message):
                raise ValueError("a turn cannot hold control records (extra CONTROL)")
        chained = [batch[0].model_copy(update={"parent": self.head})]
        chained += [m.model_copy(update={"parent": "auto"}) for m in batch[1:]]
        replies = [i for i, m in enumerate(chained) if m.role != "user"]
        state = self.checkpoint(context) if checkpoint and replies else {}
        if state:
            last = chained[replies[-1]]
            chained[replies[-1]] = last.model_copy(update={"extra": {**last.extra, **state}})
        return chained

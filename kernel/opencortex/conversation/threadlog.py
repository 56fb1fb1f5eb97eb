"""A thread's messages as a graph of PARENT pointers, with named branches and a head.

`ThreadLog.load` reads the thread's org file once and replays it: conversation
records become nodes of the graph, control records (see `branches`) rebuild the
branch tips, the current branch, the pins and the compression strategy.  Every
later change is written to the archive first and then applied to memory by the
same replay step, so a fresh `load` after a restart always gives the same state.  After loading,
nothing here reads the archive again: `ancestors` walks an in-memory map and
the current branch's path is cached and extended as turns are appended.

A turn is a user message and everything after it up to the next user message
(messages before the first user message form turn 1 on their own).  Use one
ThreadLog per thread per process; messages other code appends to the same
thread are seen on the next `load`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from opencortex.conversation.branches import (MERGED_FROM, BranchState, control_message,
                                              is_control, origin_of)
from opencortex.conversation.entries import Entry, default_retention
from opencortex.conversation.turns import Turn
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, NewMessage
from opencortex.memory.records import check_thread


class UnknownMessage(KeyError, ValueError):
    """No conversation message with that id in this thread."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown message"


class ThreadLog:
    """One thread's messages as a graph (PARENT pointers) with branches and a head."""

    def __init__(self, archive: Archive, thread: Thread):
        """An empty log; use `ThreadLog.load` to read a thread's history."""
        self.archive = archive
        self.thread = check_thread(thread)
        self._records: dict[str, MessageRecord] = {}     # conversation records only
        self._parent: dict[str, str | None] = {}         # effective parent of each record
        self._controls: set[str] = set()                 # ids of control records
        self._state = BranchState()
        self._path: list[str] = []                       # root .. _path_head
        self._path_head: str | None = None
        self._turn_starts: list[int] = []                # indexes into _path where turns begin

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
        if is_control(record):
            self._controls.add(record.id)
            self._state.apply_control(record)
            return
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
        if record.role == "user" or not self._path:
            self._turn_starts.append(len(self._path))
        self._path.append(record.id)
        self._path_head = record.id

    def _write(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """Append MESSAGES in one archive write, then apply them."""
        records = self.archive.append(messages)
        for record in records:
            self._apply(record)
        return records

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
        try:
            return self._records[message_id]
        except KeyError:
            raise UnknownMessage(f"there is no message {message_id!r} in {self.thread}") from None

    def __len__(self) -> int:
        """How many conversation messages the thread holds, on all branches."""
        return len(self._records)

    # -- the current branch's path -----------------------------------------

    def _current_path(self) -> list[str]:
        """Ids from the root to the head; cached, rebuilt only after the head jumped."""
        head = self._state.head
        if head != self._path_head:
            self._path = self._walk(head)
            self._turn_starts = [i for i, mid in enumerate(self._path)
                                 if i == 0 or self._records[mid].role == "user"]
            self._path_head = head
        return self._path

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
            path = self._current_path()
        else:
            self.record(message_id)
            path = self._walk(message_id)
        if limit is not None:
            path = path[max(0, len(path) - limit):]
        return [self._records[mid] for mid in path]

    def turn_count(self) -> int:
        """How many turns the current branch has."""
        self._current_path()
        return len(self._turn_starts)

    def turns(self) -> list[Turn]:
        """The turns of the current branch, numbered 1..N."""
        path = self._current_path()
        return [self._turn_at(n, path) for n in range(1, len(self._turn_starts) + 1)]

    def turn(self, number: int) -> Turn:
        """Turn NUMBER of the current branch (ValueError when there is none)."""
        path = self._current_path()
        count = len(self._turn_starts)
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
            raise ValueError(f"there is no turn {number} (this branch has {count})")
        return self._turn_at(number, path)

    def _turn_at(self, number: int, path: list[str]) -> Turn:
        start = self._turn_starts[number - 1]
        end = self._turn_starts[number] if number < len(self._turn_starts) else len(path)
        records = [self._records[mid] for mid in path[start:end]]
        if records[0].role == "user":
            return Turn(number, records[0], records[1:])
        return Turn(number, None, records)

    def turn_of(self, message_id: str) -> int | None:
        """The number of the current branch's turn holding MESSAGE_ID (None when off it)."""
        path = self._current_path()
        self.record(message_id)
        # Positions on the path are found by walking up from the message (it may be deep).
        depth = len(self._walk(message_id)) - 1
        if depth >= len(path) or path[depth] != message_id:
            return None
        return bisect.bisect_right(self._turn_starts, depth)

    def entries(self, *, limit: int | None = None) -> list[Entry]:
        """The current branch as Entries (pinned ones PRESERVED), oldest first.

        LIMIT keeps only the newest LIMIT messages; the cost follows LIMIT, not
        the length of the thread.
        """
        path = self._current_path()
        first = 0 if limit is None else max(0, len(path) - limit)
        pins = self._state.pins
        out = []
        for index in range(first, len(path)):
            record = self._records[path[index]]
            retention = ("PRESERVED" if record.id in pins
                         else default_retention(record.role, record.text, record.turn_type))
            out.append(Entry(id=record.id, role=record.role, text=record.text,
                             turn=bisect.bisect_right(self._turn_starts, index),
                             turn_type=record.turn_type, retention=retention))
        return out

    # -- writing ----------------------------------------------------------

    def append_turn(self, messages: Sequence[NewMessage]) -> list[MessageRecord]:
        """Archive MESSAGES (one turn) after the head in one write; the head moves to the last."""
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
        return self._write(chained)

    def _target_of_turn(self, turn: int | None) -> str:
        target = self.head if turn is None else self.turn(turn).last
        if target is None:
            raise ValueError("there is nothing to branch from yet: this thread has no messages")
        return target

    def _describe(self, message_id: str) -> str:
        number = self.turn_of(message_id)
        return f"turn {number}" if number is not None else f"message {message_id[:8]}"

    def fork(self, turn: int | None = None, *, at: str | None = None) -> str:
        """Start a new branch from the end of turn TURN (default: the head), or from message AT.

        The new branch ("b2", "b3", …) becomes current; its name is returned.
        """
        target = self.record(at).id if at is not None else self._target_of_turn(turn)
        return self._new_branch(target, f"Forked branch {{name}} at {self._describe(target)}")

    def start_afresh(self) -> str:
        """A new, empty branch (nothing before it) that becomes current; its name."""
        return self._new_branch(None, "Started branch {name} afresh")

    def _new_branch(self, target: str | None, description: str) -> str:
        """Create the next branch with its tip at TARGET and make it current.
        DESCRIPTION, with {name} for the branch's name, is the archive's line for it."""
        name = self._state.next_name()
        self._write([
            control_message(self.thread, "branch", target=target, branch=name,
                            text=description.format(name=name)),
            control_message(self.thread, "head", target=target, branch=name,
                            text=f"Switched to branch {name}")])
        return name

    def switch(self, branch: str) -> None:
        """Make BRANCH current (ValueError naming the branches when it does not exist)."""
        self._check_branch(branch)
        if branch != self.branch:
            self._write([control_message(self.thread, "head", target=self._state.tips[branch],
                                         branch=branch, text=f"Switched to branch {branch}")])

    def rewind(self, turn: int) -> str | None:
        """Move the current branch's head back to the end of turn TURN.

        The later turns stay archived: on a new branch unless another branch
        already reaches them.  Returns that branch's name (None when TURN is
        already the last turn and nothing moves).
        """
        count = self.turn_count()
        target = self.turn(turn).last
        if turn == count:
            return None
        old_head = self.head
        keeper = next((name for name, tip in self._state.tips.items()
                       if name != self.branch and tip is not None
                       and self._reaches(tip, old_head)), None)
        messages = []
        if keeper is None:
            keeper = self._state.next_name()
            messages.append(control_message(
                self.thread, "branch", target=old_head, branch=keeper,
                text=f"Kept turns {turn + 1}-{count} of {self.branch} on branch {keeper}"))
        messages.append(control_message(
            self.thread, "head", target=target, branch=self.branch,
            text=f"Rewound {self.branch} to turn {turn} (turns {turn + 1}-{count} "
                 f"are on {keeper})"))
        self._write(messages)
        return keeper

    def reaches(self, branch: str, message_id: str | None) -> bool:
        """Whether MESSAGE_ID is on BRANCH (its tip or an ancestor); None, where
        every branch starts, always is."""
        self._check_branch(branch)
        tip = self._state.tips[branch]
        return message_id is None or (tip is not None and self._reaches(tip, message_id))

    def _reaches(self, tip: str, message_id: str | None) -> bool:
        """True when MESSAGE_ID is TIP or one of its ancestors."""
        here: str | None = tip
        for _ in range(len(self._records) + 1):
            if here is None:
                return False
            if here == message_id:
                return True
            here = self._parent[here]
        return False

    def merge(self, branch: str) -> list[MessageRecord]:
        """Copy BRANCH's messages that the head lacks onto the head; returns the copies.

        Copies get new ids and MERGED_FROM=<original id>.  A message is already
        there when the head's past holds it, or a copy of it, or the original
        it was itself copied from, so merging twice adds nothing.
        """
        self._check_branch(branch)
        if branch == self.branch:
            raise ValueError(f"cannot merge branch {branch} into itself")
        mine = self._current_path()
        have = set(mine) | {origin_of(self._records[mid]) for mid in mine}
        theirs = self._walk(self._state.tips[branch])
        missing = [self._records[mid] for mid in theirs
                   if mid not in have and origin_of(self._records[mid]) not in have]
        if not missing:
            return []
        copies = [NewMessage(role=r.role, text=r.text, thread=self.thread, sender=r.sender,
                             turn_type=r.turn_type,
                             extra={**r.extra, MERGED_FROM: origin_of(r)},
                             parent=self.head if i == 0 else "auto")
                  for i, r in enumerate(missing)]
        return self._write(copies)

    def _check_branch(self, branch: str) -> None:
        if branch not in self._state.tips:
            raise ValueError(f"there is no branch {branch!r}; branches: "
                             + ", ".join(self._state.tips))

    def set_strategy(self, name: str) -> bool:
        """Keep NAME as this thread's compression strategy (the caller checked it is
        one); False when it already was."""
        if name == self._state.strategy:
            return False
        self._write([control_message(self.thread, "strategy", target=None, branch=self.branch,
                                     text=f"Compression strategy {name}", value=name)])
        return True

    def pin(self, message_id: str) -> bool:
        """Pin MESSAGE_ID (it is never folded away); False when it already was."""
        record = self.record(message_id)
        if record.id in self._state.pins:
            return False
        self._write([control_message(self.thread, "pin", target=record.id, branch=self.branch,
                                     text=f"Pinned {self._describe(record.id)}")])
        return True

    def unpin(self, message_id: str) -> bool:
        """Unpin MESSAGE_ID; False when it was not pinned."""
        record = self.record(message_id)
        if record.id not in self._state.pins:
            return False
        self._write([control_message(self.thread, "unpin", target=record.id,
                                     branch=self.branch,
                                     text=f"Unpinned {self._describe(record.id)}")])
        return True

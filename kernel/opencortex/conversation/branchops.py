"""The operations that change a thread log's branches, head, pins and strategy.

`BranchOps` is a part of `ThreadLog` (kept apart for size): each operation
writes control records (see `branches`) through the log's `_write`, which
applies them as a replay would.  Operations that need the whole graph first
make a log resumed from the tail of its file whole (`_complete`).
"""

from __future__ import annotations

from opencortex.conversation.branches import MERGED_FROM, control_message, origin_of
from opencortex.conversation.checkpoint import CHECKPOINT
from opencortex.memory import MessageRecord, NewMessage


class BranchOps:
    """Fork, start afresh, switch, rewind, merge, pin, unpin and strategy for a ThreadLog."""

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
        self._complete()
        target = self.record(at).id if at is not None else self._target_of_turn(turn)
        return self._new_branch(target, f"Forked branch {{name}} at {self._describe(target)}")

    def start_afresh(self) -> str:
        """A new, empty branch (nothing before it) that becomes current; its name."""
        self._complete()
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
        self._complete()
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

        Copies get new ids and MERGED_FROM=<original id> (and no checkpoint: that
        described the original's write).  A message is already there when the
        head's past holds it, or a copy of it, or the original it was itself
        copied from, so merging twice adds nothing.
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
                             extra={**{k: v for k, v in r.extra.items() if k != CHECKPOINT},
                                    MERGED_FROM: origin_of(r)},
                             parent=self.head if i == 0 else "auto")
                  for i, r in enumerate(missing)]
        return self._write(copies)

    def _check_branch(self, branch: str) -> None:
        self._complete()
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

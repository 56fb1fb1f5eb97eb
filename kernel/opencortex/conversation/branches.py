"""Branches of a thread: named tips, the current branch, pins, and the control records
that persist them in the thread's own org file.

A control record is an ordinary archive entry (role "system", turn type
"silence", no parent) whose `extra` says what changed::

    CONTROL  branch | head | pin | unpin | strategy | summary | checkpoint | delivery
    TARGET   a message id ("" for none)
    BRANCH   a branch name
    VALUE    the strategy's name (`strategy` only)

- `branch`: create branch BRANCH with its tip at TARGET (the current branch stays);
- `head`: make BRANCH current, with its tip at TARGET (created when new);
- `pin` / `unpin`: pin or unpin message TARGET;
- `strategy`: the thread's compression strategy is VALUE from now on;
- `summary`: a summary the working context made (see `storedsummaries`); it
  changes no branch state;
- `checkpoint`: carries only a `:CHECKPOINT:` (see `checkpoint`), written after
  a thread was filled by other means (`memory import`) so the next start
  resumes from the tail; it changes no branch state;
- `delivery`: message TARGET, archived, never reached the person (see
  `delivery`); it changes no branch state.

Its text is one human line ("Forked branch b2 at turn 3") so the file stays
readable in Emacs.  Replaying a thread's records in file order through
`BranchState` rebuilds exactly the state that was live before a restart.

A merge copies messages (new ids, MERGED_FROM = the original's id); search
shows each message once by folding copies into their origin (`unique`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Literal, TypeVar

from opencortex.events import Thread
from opencortex.memory import MessageRecord, NewMessage

log = logging.getLogger(__name__)

CONTROL = "CONTROL"
TARGET = "TARGET"
BRANCH = "BRANCH"
VALUE = "VALUE"
MERGED_FROM = "MERGED_FROM"
MAIN = "main"
ControlKind = Literal["branch", "head", "pin", "unpin", "strategy", "checkpoint"]
CONTROL_KINDS: tuple[str, ...] = ("branch", "head", "pin", "unpin", "strategy", "summary",
                                  "checkpoint", "delivery")
R = TypeVar("R", bound=MessageRecord)
_GENERATED_NAME = re.compile(r"b([0-9]+)")


def is_control(record: MessageRecord | NewMessage) -> bool:
    """True for a control record (branch/head/pin state), which no prompt or view shows."""
    return record.role == "system" and CONTROL in record.extra


def origin_of(record: MessageRecord) -> str:
    """The id of the message RECORD is a copy of (itself unless it was merged in)."""
    return record.extra.get(MERGED_FROM) or record.id


def unique(records: Iterable[R], *, seen: Iterable[str] = ()) -> list[R]:
    """RECORDS (search hits, say) with each message once: a merged copy is left out
    when its original or another copy came earlier, or its origin is in SEEN."""
    seen = seen if isinstance(seen, AbstractSet) else set(seen)
    known: set[str] = set()
    kept = []
    for record in records:
        origin = origin_of(record)
        if origin not in known and record.id not in known and origin not in seen \
                and record.id not in seen:
            known.update((origin, record.id))
            kept.append(record)
    return kept


def control_message(thread: Thread, kind: ControlKind, *, target: str | None, branch: str,
                    text: str, value: str = "") -> NewMessage:
    """The control record that persists one change of branch, head, pin or strategy."""
    extra = {CONTROL: kind, TARGET: target or "", BRANCH: branch}
    if value:
        extra[VALUE] = value
    return NewMessage(role="system", text=text, thread=thread, turn_type="silence",
                      parent=None, extra=extra)


class BranchState:
    """Branch tips (in order of creation), the current branch and the pinned message ids."""

    def __init__(self) -> None:
        self.tips: dict[str, str | None] = {MAIN: None}
        self.current: str = MAIN
        self.pins: set[str] = set()
        self.strategy: str | None = None      # None: the configured default

    @property
    def head(self) -> str | None:
        """The tip of the current branch."""
        return self.tips[self.current]

    def next_name(self) -> str:
        """A fresh branch name: "b2", "b3", … (one more than the highest in use)."""
        numbers = [int(m.group(1)) for name in self.tips
                   if (m := _GENERATED_NAME.fullmatch(name))]
        return f"b{max([len(self.tips)] + numbers) + 1}"

    def apply_control(self, record: MessageRecord) -> None:
        """Replay one control record."""
        kind = record.extra.get(CONTROL)
        target = record.extra.get(TARGET) or None
        branch = record.extra.get(BRANCH) or self.current
        if kind == "branch":
            self.tips[branch] = target
        elif kind == "head":
            self.tips[branch] = target
            self.current = branch
        elif kind == "pin" and target:
            self.pins.add(target)
        elif kind == "unpin" and target:
            self.pins.discard(target)
        elif kind == "strategy":
            self.strategy = record.extra.get(VALUE) or None
        elif kind in ("summary", "checkpoint", "delivery"):
            pass                              # no branch state
        else:
            log.debug("ignored a control record of unknown kind %r", kind)

    def advance(self, parent: str | None, new_id: str) -> str:
        """A message NEW_ID now follows PARENT: move the branch whose tip PARENT was.

        The current branch wins when several branches share that tip.  A message
        that follows no tip (written by something other than a ThreadLog) starts
        a branch of its own.  Returns the name of the branch that moved.
        """
        if self.tips[self.current] == parent:
            name = self.current
        else:
            name = next((n for n, tip in self.tips.items() if tip == parent), None)
            if name is None:
                name = self.next_name()
        self.tips[name] = new_id
        return name

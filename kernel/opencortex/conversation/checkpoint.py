"""Checkpoints: what a restart needs to resume a thread from the tail of its file.

A turn written through `Conversations.record_turn` carries, on its last reply
record, one extra property `:CHECKPOINT:` describing the thread log's state
just BEFORE that write (the write itself is replayed on top of it)::

    :CHECKPOINT: head=<id> branch=main turns=41 tokens=5230 seen=<id> first=<id> strategy=summarize pins=<id>,<id> summary=<id> sum=<crc32>

- head, branch: the current branch and its newest message ("" when empty);
- turns, tokens: that branch's turn count and TOKENS_IN + TOKENS_OUT so far;
- strategy, pins: the thread's compression strategy ("" = configured) and pins;
- seen: the id of the last entry of the file the writer knew of ("" = none),
  so a reader can tell that no other process wrote in between;
- first: the id of the first conversation message of the file ("" = none yet),
  so a reader can tell that older messages were not forgotten since;
- summary: the newest summary record of the branch ("" = none), which a restart
  puts back even when it lies before the tail it reads;
- sum: the CRC-32 of everything before it, so that a hand edit of the line is
  noticed (a checkpoint saying 999 turns would number every later turn wrong).

Values are ids, numbers and words separated by single spaces; a branch name
is percent-encoded.  A value that cannot be read, or whose sum does not match
(or that has none: an older kernel wrote it), is no checkpoint: the thread is
then read whole, as before checkpoints existed, and its next turn writes one.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

from opencortex.conversation.branches import control_message
from opencortex.events import Thread
from opencortex.memory import NewMessage

CHECKPOINT = "CHECKPOINT"
_FIELD = re.compile(r"([a-z]+)=(\S*)")
_FIELDS = ("head", "branch", "turns", "tokens", "seen", "first", "strategy", "pins", "summary",
           "sum")


@dataclass(frozen=True)
class Checkpoint:
    """A thread log's state before one write."""

    head: str | None
    branch: str
    turns: int
    tokens: int
    seen: str | None
    first: str | None
    strategy: str | None
    pins: frozenset[str]
    summary: str | None = None

    def render(self) -> str:
        """The `:CHECKPOINT:` value (one line)."""
        value = (f"head={self.head or ''} branch={quote(self.branch, safe='')} "
                 f"turns={self.turns} tokens={self.tokens} seen={self.seen or ''} "
                 f"first={self.first or ''} strategy={self.strategy or ''} "
                 f"pins={','.join(sorted(self.pins))} summary={self.summary or ''}")
        return f"{value} sum={_sum(value)}"


def _sum(value: str) -> str:
    return f"{zlib.crc32(value.encode('utf-8')):08x}"


def parse_checkpoint(value: str) -> Checkpoint | None:
    """The checkpoint VALUE describes; None when it is malformed, incomplete or edited
    (its sum does not match)."""
    fields = dict(_FIELD.findall(value))
    if set(fields) != set(_FIELDS) or len(value.split()) != len(_FIELDS):
        return None
    signed, _, given = value.rpartition(" sum=")
    if given != _sum(signed):
        return None
    try:
        turns, tokens = int(fields["turns"]), int(fields["tokens"])
        branch = unquote(fields["branch"], errors="strict")
    except ValueError:
        return None
    if turns < 0 or tokens < 0 or not branch:
        return None
    return Checkpoint(head=fields["head"] or None, branch=branch, turns=turns, tokens=tokens,
                      seen=fields["seen"] or None, first=fields["first"] or None,
                      strategy=fields["strategy"] or None,
                      pins=frozenset(p for p in fields["pins"].split(",") if p),
                      summary=fields["summary"] or None)


def checkpoint_message(thread: Thread, checkpoint: Checkpoint) -> NewMessage:
    """The control record (a write of its own) that ends THREAD, filled by other means
    than turns (`memory import`), with CHECKPOINT, so a start resumes from there."""
    message = control_message(
        thread, "checkpoint", target=checkpoint.head, branch=checkpoint.branch,
        text=f"Checkpoint after {checkpoint.turns} turns (a restart resumes here)")
    return message.model_copy(update={"extra": {**message.extra,
                                                CHECKPOINT: checkpoint.render()}})

"""Checkpoints: what a restart needs to resume a thread from the tail of its file.

A turn written through `Conversations.record_turn` carries, on its last reply
record, one extra property `:CHECKPOINT:` describing the thread log's state
just BEFORE that write (the write itself is replayed on top of it)::

    :CHECKPOINT: head=<id> branch=main turns=41 tokens=5230 seen=<id> first=<id> strategy=summarize pins=<id>,<id> summary=<id> oldest=<id> smalltalk=<id> above=312 unpinned=<id> summaries=summary:<id> sum=<crc32>

- head, branch: the current branch and its newest message ("" when empty);
- turns, tokens: that branch's turn count and TOKENS_IN + TOKENS_OUT so far;
- strategy, pins: the thread's compression strategy ("" = configured) and pins;
- seen: the id of the last entry of the file the writer knew of ("" = none),
  so a reader can tell that no other process wrote in between;
- first: the id of the first conversation message of the file ("" = none yet),
  so a reader can tell that older messages were not forgotten since;
- summary: the newest summary record of the branch ("" = none), which a restart
  puts back even when it lies before the tail it reads;
- oldest, smalltalk, above, unpinned, summaries: the working context (see
  `ContextMark`), so that a restart restores the context the thread had: the
  oldest message it held that is not pinned ("-" = none; "" = not known:
  written without a context, by `memory import`), the newest small-talk message
  compression let go ("" = none), the tokens it had to pass to compress again
  ("" = the threshold), the messages it held in their place because they were
  pinned when older ones left (unpinned since, not let go yet), and the kept
  summaries it held (their entry ids, in the context's order; see
  `storedsummaries`);
- sum: the CRC-32 of everything before it, so that a hand edit of the line is
  noticed (a checkpoint saying 999 turns would number every later turn wrong).

Values are ids, numbers and words separated by single spaces; a branch name
is percent-encoded.  A value that cannot be read, or whose sum does not match
(or that has none, or lacks a field: an older kernel wrote it), is no
checkpoint: the thread is then read whole, as before checkpoints existed, and
its next turn writes one.
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
           "oldest", "smalltalk", "above", "unpinned", "summaries", "sum")
NONE_KEPT = "-"          # `oldest` of a context that held no message but pinned ones


@dataclass(frozen=True)
class ContextMark:
    """Where a working context started on its branch, before a write.

    The context holds the messages of its branch from OLDEST on (and the pinned
    ones before it), except the small talk compression let go: SMALLTALK and
    the DROPPABLE messages before it.  OLDEST is None when it held no message
    but pinned ones.  Past the threshold it compresses again only above ABOVE
    tokens (None: at once), as a context stuck above it waits for a band of
    new tokens.  UNPINNED are messages it holds in their place, older than
    OLDEST or small talk before SMALLTALK, because they were pinned then (an
    unpinned message stays until a compression lets it go).  SUMMARIES are the
    entry ids of the summaries it holds (kept as records of the thread), in
    its order: each stands where the first message it covers stood.
    """

    oldest: str | None
    smalltalk: str | None = None
    above: int | None = None
    unpinned: frozenset[str] = frozenset()
    summaries: tuple[str, ...] = ()


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
    context: ContextMark | None = None      # None: not known (written without a context)

    def render(self) -> str:
        """The `:CHECKPOINT:` value (one line)."""
        mark = self.context
        oldest = "" if mark is None else mark.oldest or NONE_KEPT
        smalltalk = (mark and mark.smalltalk) or ""
        above = "" if mark is None or mark.above is None else mark.above
        unpinned = ",".join(sorted(mark.unpinned)) if mark is not None else ""
        summaries = ",".join(mark.summaries) if mark is not None else ""
        value = (f"head={self.head or ''} branch={quote(self.branch, safe='')} "
                 f"turns={self.turns} tokens={self.tokens} seen={self.seen or ''} "
                 f"first={self.first or ''} strategy={self.strategy or ''} "
                 f"pins={','.join(sorted(self.pins))} summary={self.summary or ''} "
                 f"oldest={oldest} smalltalk={smalltalk} above={above} unpinned={unpinned} "
                 f"summaries={summaries}")
        return f"{value} sum={_sum(value)}"


def _sum(value: str) -> str:
    return f"{zlib.crc32(value.encode('utf-8')):08x}"


def _ids(value: str) -> frozenset[str]:
    """The ids of a comma-separated VALUE."""
    return frozenset(i for i in value.split(",") if i)


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
        above = int(fields["above"]) if fields["above"] else None
        branch = unquote(fields["branch"], errors="strict")
    except ValueError:
        return None
    if turns < 0 or tokens < 0 or not branch or (above is not None and above < 0):
        return None
    oldest = fields["oldest"]
    context = None if not oldest else ContextMark(
        oldest=None if oldest == NONE_KEPT else oldest, smalltalk=fields["smalltalk"] or None,
        above=above, unpinned=_ids(fields["unpinned"]),
        summaries=tuple(i for i in fields["summaries"].split(",") if i))
    return Checkpoint(head=fields["head"] or None, branch=branch, turns=turns, tokens=tokens,
                      seen=fields["seen"] or None, first=fields["first"] or None,
                      strategy=fields["strategy"] or None,
                      pins=_ids(fields["pins"]),
                      summary=fields["summary"] or None, context=context)


def checkpoint_message(thread: Thread, checkpoint: Checkpoint) -> NewMessage:
    """The control record (a write of its own) that ends THREAD with CHECKPOINT, so a start
    resumes from there: THREAD was filled by other means than turns (`memory import`),
    or its working context filled anew (see `Conversations.refill`)."""
    message = control_message(
        thread, "checkpoint", target=checkpoint.head, branch=checkpoint.branch,
        text=f"Checkpoint after {checkpoint.turns} turns (a restart resumes here)")
    return message.model_copy(update={"extra": {**message.extra,
                                                CHECKPOINT: checkpoint.render()}})

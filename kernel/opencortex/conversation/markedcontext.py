"""The working context the newest checkpoint describes, and how its turn was taken.

A turn's checkpoint says where the working context started before that turn
(`checkpoint.ContextMark`); the log says what came after it
(`resumable.SinceCheckpoint`).  `marked_window` reads from them:

- the messages the context held: from its oldest one on, without the small
  talk compression had let go (the pinned ones before it, and those unpinned
  in place, are added by `restoredcontext`), then the checkpoint's turn;
- the kept summaries it held (see `storedsummaries`);
- how the live context took that turn: with the strategy and the wait of then,
  and with the pins of the newest /pin since (a /pin fills the context again
  from here, so its pins count as made before the turn; those unpinned since
  are unpinned after it), its fold made again from the summary kept after it
  rather than asked of the summarizer;
- what followed on the branch that the live context never took as part of that
  turn (another writer's messages), and the strategies chosen since (a change
  lifted the wait).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opencortex.conversation.checkpoint import ContextMark
from opencortex.conversation.entries import Entry
from opencortex.conversation.resumable import SinceCheckpoint
from opencortex.conversation.resume import TAIL_LIMIT
from opencortex.conversation.storedsummaries import StoredSummary
from opencortex.conversation.threadlog import ThreadLog

MARK_REACH = TAIL_LIMIT                 # messages back a context's start is looked for


@dataclass(frozen=True)
class Window:
    """The messages a context is filled with (after a summary, if any), and why."""

    messages: list[Entry]
    mark: ContextMark | None = None       # the context the newest checkpoint described
    smalltalk_gone: Entry | None = None   # the message its `smalltalk` names
    unpinned_since: frozenset[str] = frozenset()   # pinned when its turn was taken, no more
    strategy_then: str | None = None      # that turn's strategy (None: the configured one)
    strategies_since: tuple[str | None, ...] = ()  # chosen after it, in order
    summaries: tuple[StoredSummary, ...] = ()      # the kept summaries the context held
    recorded: tuple[StoredSummary, ...] = ()       # the summaries kept since, newest first
    later: frozenset[str] = frozenset()   # messages after the checkpoint's turn

    def extra_ids(self) -> frozenset[str]:
        """Messages of the context before its start: unpinned in place, before or since."""
        return self.unpinned_since | (self.mark.unpinned if self.mark else frozenset())


def pinned_as_then(entries: list[Entry], ids: frozenset[str]) -> list[Entry]:
    """ENTRIES, those of IDS PRESERVED (as they were when the checkpoint's turn was taken:
    the context unpins them again once it is filled)."""
    return [replace(e, retention="PRESERVED") if e.id in ids else e for e in entries]


def marked_window(log: ThreadLog) -> Window | None:
    """The messages of the working context the newest checkpoint describes, then those
    written with it and after it, oldest first (pinned ones before its start left out);
    None when no checkpoint says, a summary it names is not kept, or its start is not
    among the newest MARK_REACH messages of the branch."""
    checkpoint, since = log.newest_checkpoint(), log.since_checkpoint()
    if checkpoint is None or checkpoint.context is None or since is None:
        return None
    mark = checkpoint.context
    summaries = tuple(log.kept_summary(entry_id) for entry_id in mark.summaries)
    count = _context_size(log, mark, checkpoint.head)
    if count is None or None in summaries:
        return None
    unpinned = (checkpoint.pins | (since.pinned or frozenset())) - log.pins()
    messages = pinned_as_then(log.entries(limit=count) if count else [], unpinned)
    gone = log.position(mark.smalltalk, within=MARK_REACH) if mark.smalltalk else None
    first_kept = max(0, len(messages) - gone) if gone is not None else 0
    kept = [entry for index, entry in enumerate(messages) if entry.retention != "DROPPABLE"
            or index >= first_kept or entry.id in mark.unpinned]
    after = _after_turn(log, since, checkpoint.head, count)
    later = frozenset(entry.id for entry in messages[len(messages) - after:]) if after else \
        frozenset()
    return Window(kept, mark, _smalltalk(log, messages, gone), unpinned, checkpoint.strategy,
                  since.strategies, summaries, since.summaries, later)


def _after_turn(log: ThreadLog, since: SinceCheckpoint, head: str | None, count: int) -> int:
    """How many of the newest COUNT messages of the branch came after the checkpoint's turn
    (SINCE, HEAD: the head then): after the message carrying it, or, for a checkpoint
    written on its own, after HEAD (all of them when the branch was empty)."""
    if since.with_turn:
        return log.position(since.carrier, within=count) or 0
    if head is None:
        return count
    return log.position(head, within=count) or 0


def _smalltalk(log: ThreadLog, messages: list[Entry], back: int | None) -> Entry | None:
    """The message BACK messages before the head (the newest small talk let go), from
    MESSAGES (the newest of the branch) or, older than they are, from the log."""
    if back is None:
        return None
    if back < len(messages):
        return messages[len(messages) - 1 - back]
    return log.entries(limit=back + 1)[0]


def _context_size(log: ThreadLog, mark: ContextMark, head: str | None) -> int | None:
    """How many of the newest messages of the branch the context MARK describes spans
    (from its oldest on, the checkpoint's turn and later included; HEAD: the head
    then); None when its start is not among the newest MARK_REACH."""
    if mark.oldest is not None:
        back = log.position(mark.oldest, within=MARK_REACH)
        return None if back is None else back + 1
    if head is None:                     # the branch was empty: all of it came since
        return len(log.recent_ids(MARK_REACH))
    return log.position(head, within=MARK_REACH)   # only pinned ones: what came after

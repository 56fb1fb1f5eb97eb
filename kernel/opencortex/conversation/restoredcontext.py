"""What a fresh working context is filled with: after a start, a fork, a rewind, /pin …

The entries come from the thread log (never another thread), in one of three
ways, the first that applies:

1. with the summarize and galois strategies, the newest summary the branch
   kept (see `storedsummaries`), the messages after it, and the pinned ones;
2. the newest checkpoint of the branch names where the working context
   started (`checkpoint.ContextMark`): the messages from there on, without the
   small talk compression had let go, and the pinned ones before (and those
   unpinned since, still in their place).  That is the context as it was before
   the checkpoint's turn, plus that turn: `fill` adds them as the live context
   took that turn (compressing only where it did, with the strategy and pins of
   then, the unpins and strategy chosen since applied after), so a restart
   gives the model exactly what it saw before;
3. otherwise (no checkpoint since the branch changed, one written without a
   context by `memory import`, one that was edited, one from an older kernel):
   the newest WINDOW messages and the pinned ones, which the context then
   compresses to its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from opencortex.conversation.checkpoint import ContextMark
from opencortex.conversation.compression import STRATEGIES, CompressionReport
from opencortex.conversation.context import WorkingContext
from opencortex.conversation.entries import Entry
from opencortex.conversation.resume import TAIL_LIMIT
from opencortex.conversation.storedsummaries import restored_entry
from opencortex.conversation.threadlog import ThreadLog

SUMMARIZING = ("summarize", "galois")   # strategies whose summaries are kept and restored
MARK_REACH = TAIL_LIMIT                 # messages back a context's start is looked for


@dataclass(frozen=True)
class Window:
    """The messages a context is filled with (after a summary, if any), and why."""

    messages: list[Entry]
    mark: ContextMark | None = None       # the context the newest checkpoint described
    smalltalk_gone: Entry | None = None   # the message its `smalltalk` names
    unpinned_since: frozenset[str] = frozenset()   # pinned at the checkpoint, no more
    strategy_changed: bool = False        # since the checkpoint, from STRATEGY_THEN
    strategy_then: str | None = None      # (None: the configured one)

    def extra_ids(self) -> frozenset[str]:
        """Messages of the context before its start: unpinned in place, before or since."""
        return self.unpinned_since | (self.mark.unpinned if self.mark else frozenset())


@dataclass(frozen=True)
class Restored:
    """What a fresh working context is filled with."""

    summary: list[Entry]            # the newest kept summary of the branch, or none
    window: Window                  # the messages after it (or of the context, or newest)
    pinned: list[Entry]             # pinned messages before those, and those the summary
                                    # left out as pinned then (or unpinned in place)

    def entries(self) -> list[Entry]:
        """All of them in the branch's order (pins before the summary's turns first)."""
        start = self.summary[0].turn if self.summary else 0
        return [e for e in self.pinned if e.turn < start] + self.summary + \
            [e for e in self.pinned if e.turn >= start] + self.window.messages


def restored(log: ThreadLog, strategy: str, window: int) -> Restored:
    """The newest kept summary of the branch, the messages after it and the pins; or
    the messages of the context the newest checkpoint describes, or the newest WINDOW
    messages, and the pins before them (see the module)."""
    summary, found, kept = _summary_and_window(log, strategy, window)
    in_window = {entry.id for entry in found.messages}
    pinned = log.entries_of((log.pins() | kept | found.extra_ids()) - in_window)
    return Restored(summary, found, _pinned_as_then(pinned, found.unpinned_since))


async def fill(context: WorkingContext, found: Restored, entries: Sequence[Entry], *,
               configured: str) -> CompressionReport | None:
    """Add ENTRIES (FOUND's, those the model is shown) to the empty CONTEXT.  From a
    checkpoint's mark, the turn written with it is added as the live context took it:
    with the strategy (None there: CONFIGURED), the wait and the pins of then; the
    unpins and the strategy chosen since follow (a summarizing strategy of then is not
    used again: it made and kept its summary already)."""
    window, now = found.window, context.strategy
    if window.mark is not None:
        then = window.strategy_then or configured
        if window.strategy_changed and then in STRATEGIES and then not in SUMMARIZING:
            context.set_strategy(then)
        context.resume(window.mark, window.smalltalk_gone)
    report = await context.add(*entries) if entries else None
    for message_id in window.unpinned_since:
        context.unpin(message_id)
    if context.strategy != now:
        context.set_strategy(now)
    return report


def _pinned_as_then(entries: list[Entry], ids: frozenset[str]) -> list[Entry]:
    """ENTRIES, those of IDS PRESERVED (as they were when the checkpoint was written: the
    context unpins them again once it is filled)."""
    return [replace(e, retention="PRESERVED") if e.id in ids else e for e in entries]


def _summary_and_window(log: ThreadLog, strategy: str, window: int
                        ) -> tuple[list[Entry], Window, set[str]]:
    """`restored`'s summary, its messages, and the ids the summary left out."""
    if strategy in SUMMARIZING:
        near = next(((summary, after) for summary in log.summaries() if (
            after := log.position(summary.last, within=window + 1)) is not None), None)
        if near is None and (summary := log.branch_summary()) is not None:
            # More messages followed it than a start reads: the log was made whole.
            near = (summary, log.position(summary.last, within=len(log)))
        if near is not None and near[1] is not None:
            summary, after = near
            left_out = log.pins() | set(summary.kept)
            covered = log.recent_ids(after + 1 + window)
            covered = covered[:len(covered) - after]
            if summary.first in covered:
                covered = covered[covered.index(summary.first):]
            entry = restored_entry(summary, tuple(i for i in covered if i not in left_out))
            messages = log.entries(limit=after) if after else []
            return [entry], Window(messages), set(summary.kept)
    marked = marked_window(log)
    if marked is not None:
        return [], marked, set()
    return [], Window(log.entries(limit=window)), set()


def marked_window(log: ThreadLog) -> Window | None:
    """The messages of the working context the newest checkpoint describes, then those
    written with it and after it, oldest first (pinned ones before its start left out);
    None when no checkpoint says, or its start is not among the newest MARK_REACH
    messages of the branch."""
    checkpoint = log.newest_checkpoint()
    if checkpoint is None or checkpoint.context is None:
        return None
    mark = checkpoint.context
    if mark.oldest is not None:
        back = log.position(mark.oldest, within=MARK_REACH)
        count = None if back is None else back + 1
    elif checkpoint.head is None:        # the branch was empty: all of it came since
        count = len(log.recent_ids(MARK_REACH))
    else:                                # only pinned messages: what came after the head
        count = log.position(checkpoint.head, within=MARK_REACH)
    if count is None:
        return None
    since = checkpoint.pins - log.pins()
    messages = _pinned_as_then(log.entries(limit=count) if count else [], since)
    gone = log.position(mark.smalltalk, within=count) if mark.smalltalk and count else None
    first_kept = len(messages) - gone if gone is not None else 0
    kept = [entry for index, entry in enumerate(messages) if entry.retention != "DROPPABLE"
            or index >= first_kept or entry.id in mark.unpinned]
    return Window(kept, mark, messages[first_kept - 1] if first_kept else None, since,
                  checkpoint.strategy != log.strategy, checkpoint.strategy)

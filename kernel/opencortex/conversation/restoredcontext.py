"""What a fresh working context is filled with: after a start, a fork, a rewind, /pin …

The entries come from the thread log (never another thread), in one of three
ways, the first that applies:

1. the newest checkpoint of the branch names where the working context
   started (see `markedcontext`): the kept summaries it held, the messages
   from its start on, without the small talk compression had let go, and the
   pinned ones before (and those unpinned since, still in their place).  That
   is the context as it was before the checkpoint's turn, plus that turn: `fill`
   adds them as the live context took that turn (compressing only where it did,
   with the strategy and pins of then, a summarizing fold made again from the
   summary kept after it; the unpins and strategy chosen since applied after),
   so a restart gives the model exactly what it saw before, whatever the
   strategy, and asks the summarizer nothing;
2. otherwise (no checkpoint since the branch changed, one written without a
   context by `memory import`, one that was edited, one from an older kernel),
   with the summarize and galois strategies: the newest summary the branch
   kept (see `storedsummaries`), the messages after it, and the pinned ones;
3. otherwise the newest WINDOW messages and the pinned ones, which the context
   then compresses to its target.

A kept summary stands where the first message it covers stood.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from opencortex.conversation.compression import STRATEGIES, CompressionReport
from opencortex.conversation.context import WorkingContext
from opencortex.conversation.entries import Entry
from opencortex.conversation.markedcontext import (MARK_REACH, Window, marked_window,
                                                   pinned_as_then)
from opencortex.conversation.storedsummaries import StoredSummary, restored_entry
from opencortex.conversation.threadlog import ThreadLog

__all__ = ["MARK_REACH", "SUMMARIZING", "Restored", "Window", "fill", "marked_window",
           "restored"]

SUMMARIZING = ("summarize", "galois")   # strategies whose summaries are kept and restored


@dataclass(frozen=True)
class Restored:
    """What a fresh working context is filled with."""

    before: list[Entry]             # kept summaries, pinned messages before the window and
                                    # those unpinned in place (or left out by a summary
                                    # as pinned then), in the branch's order
    window: Window                  # the messages after them

    def entries(self) -> list[Entry]:
        """All of them, in the branch's order."""
        return self.before + self.window.messages

    def kept_ids(self) -> set[str]:
        """The ids of the summary entries that are kept records: those restored, and
        those a fold may make again (see `WorkingContext.replay`)."""
        return {e.id for e in self.before if e.kind == "summary"} | \
            {summary.entry_id for summary in self.window.recorded}


def restored(log: ThreadLog, strategy: str, window: int) -> Restored:
    """The context the newest checkpoint describes; or the newest kept summary of the
    branch, the messages after it and the pins; or the newest WINDOW messages, and
    the pins before them (see the module)."""
    found = marked_window(log)
    if found is not None:
        left_out = log.pins()
        summaries = [_summary_entry(log, s, window, left_out | set(s.kept), MARK_REACH)
                     for s in found.summaries]
        return _with_pins(log, summaries, found, set())
    if strategy in SUMMARIZING and (after := _after_summary(log, window)) is not None:
        summary, messages = after
        return _with_pins(log, [summary[1]], Window(messages), set(summary[0].kept))
    return _with_pins(log, [], Window(log.entries(limit=window)), set())


def _with_pins(log: ThreadLog, summaries: list[Entry], found: Window,
               kept: set[str]) -> Restored:
    """SUMMARIES and FOUND, with the pinned messages before FOUND's (and KEPT: those the
    summary left out, pinned then) in their places."""
    in_window = {entry.id for entry in found.messages}
    pinned = log.entries_of((log.pins() | kept | found.extra_ids()) - in_window)
    pinned = pinned_as_then(pinned, found.unpinned_since)
    return Restored(_in_place(log, pinned, summaries), found)


def _in_place(log: ThreadLog, pinned: list[Entry], summaries: list[Entry]) -> list[Entry]:
    """PINNED (in the branch's order) and SUMMARIES, each of these where the first message
    it covers stands (first when that is not on the branch the log holds)."""
    if not pinned or not summaries:
        return summaries + pinned
    at = {mid: index for index, mid in enumerate(log.recent_ids(sys.maxsize))}
    placed = [((at.get(s.covers[0], -1) if s.covers else -1), 0, s) for s in summaries]
    placed += [(at.get(e.id, -1), 1, e) for e in pinned]
    return [entry for _, _, entry in sorted(placed, key=lambda item: item[:2])]


async def fill(context: WorkingContext, found: Restored, entries: Sequence[Entry], *,
               configured: str) -> CompressionReport | None:
    """Add ENTRIES (FOUND's, those the model is shown) to the empty CONTEXT.  From a
    checkpoint's mark, the turn written with it is added as the live context took it:
    with the strategy (None there: CONFIGURED), the wait and the pins of then, and
    the summaries kept since made again; then the unpins and the strategy chosen
    since, and last what another writer added after that turn."""
    window, now = found.window, context.strategy
    if window.mark is None:
        return await context.add(*entries) if entries else None
    then = _effective(window.strategy_then, configured)
    context.set_strategy(then)
    context.resume(window.mark, window.smalltalk_gone)
    context.replay([restored_entry(summary, ()) for summary in window.recorded])
    turn = [entry for entry in entries if entry.id not in window.later]
    report = await context.add(*turn) if turn else None
    for message_id in window.unpinned_since:
        context.unpin(message_id)
    context.set_strategy(now)
    chosen = [then] + [_effective(name, configured) for name in window.strategies_since]
    if any(a != b for a, b in zip(chosen, chosen[1:])):
        context.lift()                  # as choosing another strategy did
    later = [entry for entry in entries if entry.id in window.later]
    report = (await context.add(*later) if later else None) or report
    context.replay(())
    return report


def _effective(strategy: str | None, configured: str) -> str:
    """The strategy a context uses when STRATEGY is chosen (None or unknown: CONFIGURED)."""
    return strategy if strategy in STRATEGIES else configured


def _summary_entry(log: ThreadLog, summary: StoredSummary, window: int,
                   left_out: set[str], reach: int) -> Entry:
    """The context entry of SUMMARY, covering the messages it names that are among the
    WINDOW before its last one (when that is among the newest REACH), but LEFT_OUT."""
    after = log.position(summary.last, within=reach)
    covered = log.recent_ids(after + 1 + window) if after is not None else []
    covered = covered[:len(covered) - (after or 0)]
    if summary.first in covered:
        covered = covered[covered.index(summary.first):]
    return restored_entry(summary, tuple(i for i in covered if i not in left_out))


def _after_summary(log: ThreadLog, window: int
                   ) -> tuple[tuple[StoredSummary, Entry], list[Entry]] | None:
    """The newest kept summary of the branch (with its entry) and the messages after it;
    None when it has none."""
    near = next(((summary, after) for summary in log.summaries() if (
        after := log.position(summary.last, within=window + 1)) is not None), None)
    if near is None and (summary := log.branch_summary()) is not None:
        # More messages followed it than a start reads: the log was made whole.
        near = (summary, log.position(summary.last, within=len(log)))
    if near is None or near[1] is None:
        return None
    summary, after = near
    entry = _summary_entry(log, summary, window, log.pins() | set(summary.kept), after + 1)
    return (summary, entry), log.entries(limit=after) if after else []

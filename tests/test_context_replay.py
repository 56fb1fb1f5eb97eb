"""A working context takes a turn again as it took it before a restart: a summarizing
fold made again from the summary kept after it (`WorkingContext.replay`, without the
summarizer), and the wait for the next compression kept when nothing lifted it."""

from __future__ import annotations

import pytest

from opencortex.conversation.context import WorkingContext
from opencortex.conversation.entries import Entry
from test_context import dialogue, filled, persona, run


@pytest.mark.parametrize("strategy", ["summarize", "galois"])
def test_a_kept_summary_makes_its_fold_again_without_the_summarizer(strategy):
    """A restart adds the turn that made a summary again: `replay` has the compression
    fold the same entries into that summary, its text and id, so a start asks the
    summarizer (a model) nothing; a summary of other entries is not taken for it."""
    async def refused(entries, max_tokens):
        raise AssertionError("the summarizer was asked")

    live = WorkingContext(budget=400, strategy=strategy)
    run(live.add(persona()))
    for n, entry in enumerate(dialogue(12)):
        before = list(live.entries)
        if run(live.add(entry)) is not None:
            break
    summary = next(e for e in live.entries if e.kind == "summary")
    kept = Entry(id="summary:kept", role="system", text=summary.text, turn=summary.turn,
                 kind="summary", covers=(summary.covers[0], summary.covers[-1]))
    other = Entry(id="summary:other", role="system", text=summary.text, turn=1,
                  kind="summary", covers=("u1", "a1"))
    again = WorkingContext(budget=400, strategy=strategy, summarizer=refused)
    again.replay([other, kept])
    run(again.add(*before, entry))
    assert [(e.id, e.text) for e in again.entries] == [
        ("summary:kept" if e is summary else e.id, e.text) for e in live.entries]
    assert again.used == live.used and again.mark().above == live.mark().above
    assert n > 3 and set(summary.covers) == set(again.entries[1].covers)


def test_choosing_the_strategy_in_use_keeps_the_wait():
    """Another strategy lifts the wait for the next compression (there may be room now);
    the one in use did too, so a start, which cannot tell it was chosen, kept a wait
    the live context had lifted."""
    context = run(filled("sliding", 12, budget=200))
    waiting = context.mark().above
    context.set_strategy("sliding")
    assert waiting is not None and context.mark().above == waiting
    context.set_strategy("forget")
    assert context.mark().above is None

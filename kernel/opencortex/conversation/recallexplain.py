"""What recall brings for a question and why, as /recall shows it.

The period and words searched, the people the question names, then per hit
its score (with dense recall: the rank each ranking gave it and the fused
score), date, where, who said it, the words it matched and its text; then the
questions and replies recall brings next to them.  Text
and names are the archive's (untrusted): shown on one line each, cut short.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING

from opencortex.conversation.delivery import as_seen
from opencortex.conversation.fusion import Ranked
from opencortex.conversation.recallwords import present_words, searched_words
from opencortex.events import Thread
from opencortex.memory import MessageRecord
from opencortex.memory.query import query_text
from opencortex.memory.rows import who

if TYPE_CHECKING:
    from opencortex.conversation.recall import Recall


def explain(recall: Recall, thread: Thread, query: str, *, k: int = 10) -> str:
    """What RECALL brings for QUERY in THREAD (its K best) and why."""
    query = query_text(query)
    ranked, hint = recall.ranked(thread, query, k=k, snippets=True)
    words = searched_words(query, hint.text)
    lines = [f"searched for: {words if len(words) <= 200 else words[:199] + '…'}" if words
             else "searched for: nothing (only common words)"]
    named = recall.named(thread, words) if words else []
    if named:
        lines.append(f"people named: {', '.join(named)} (what they said leads)")
    if recall.dense is not None:
        lines.append(f"ranking: {recall.dense.describe()}")
        if ranked and ranked[0].fused is None and recall.dense.off is None:
            lines.append("the dense ranking failed this time (see the log): lexical only")
    if hint.window is not None:
        start, end = (datetime.fromtimestamp(t).strftime("%Y-%m-%d") for t in
                      (hint.window[0], hint.window[1] - 1))
        lines.append(f"dates: {start} to {end} (\"{hint.label}\"), searched first")
    if hint.recent:
        present = present_words(hint.text)
        lines.append("asks about the present: newer matches" + (
            f" and those saying {present!r}" if present else "") + " ranked higher")
    number_of = {}
    beside = recall.beside([item.hit for item in ranked])
    gone = recall.archive.undelivered([item.hit.id for item in ranked] +
                                      [partner.id for _, partner, _ in beside])
    for number, item in enumerate(ranked, 1):
        number_of[item.hit.id] = number
        terms = ", ".join(item.hit.matched)
        lines.append(f"{number}. {_why(item)}, {_said(item.hit)}; matched: {terms or '-'}\n"
                     f"   {_text(item.hit, gone)}")
    for hit, partner, reply in beside:
        what = "the reply to" if reply else "the question of"
        lines.append(f"+ {what} {number_of[hit.id]}, {_said(partner)}\n"
                     f"   {_text(partner, gone)}")
    return "\n".join(lines) if ranked else "\n".join(lines + ["Nothing recalled."])


def _said(message: MessageRecord) -> str:
    """When, where and by whom MESSAGE was said, on one line."""
    when = datetime.fromtimestamp(message.timestamp).strftime("%Y-%m-%d %H:%M")
    sender = " ".join(who(message.sender, message.extra).split())
    said = f" {sender[:60]}" if sender else ""
    return f"{when}, {message.thread}, {message.role}{said}"


def _text(message: MessageRecord, gone: Collection[str]) -> str:
    """The start of MESSAGE's text, on one line (marked when it is in GONE: the person
    never got it)."""
    return as_seen(" ".join(message.text.split())[:140], message.id in gone)


SCORE_NEAR_NOTHING = 0.005   # a BM25 score shown below this reads "~0", with the reason


def _why(item: Ranked) -> str:
    """The score of a hit; when fused, the rank each list gave it and the fused score.
    A BM25 score near 0 says why (for words in half the archive or more, as in a small one,
    BM25 weighs a word ~nothing), rather than "0.00", which reads as no match."""
    if item.fused is None:
        if abs(item.hit.score) < SCORE_NEAR_NOTHING:
            return "score ~0 (its words are in half the archive or more)"
        return f"score {item.hit.score:.2f}"
    lexical = f"lexical #{item.lexical}" if item.lexical else "lexical -"
    dense = f"dense #{item.dense}" if item.dense else "dense -"
    return f"fused {item.fused:.4f} ({lexical}, {dense})"

"""Compression strategies: how REQUIRED entries make room when the context is full.

`fold` applies one strategy to a context whose DROPPABLE entries are already
gone.  Only the entries marked movable (REQUIRED, older than the newest turn)
are touched; everything else comes back unchanged and in place.

- ``sliding``: drop the oldest turns, whole, until the context fits the target.
- ``forget``: hard truncation: keep only the newest movable entries that fit;
  everything older than the first one that does not fit is gone.
- ``summarize``: fold the oldest movable entries into ONE summary entry made by
  the summarizer, with an allowance of about a quarter of the messages it
  replaces plus the whole of an earlier summary it absorbs (a rolling summary),
  at most a quarter of the target.
- ``galois``: like summarize, then measure the semantic loss between the full
  and the compressed context; while it exceeds the tolerance, step to a gentler
  fold (a larger share of the target for the summary), and report the loss.

`recorded_fold` makes again a fold of summarize or galois that a kept summary
records, without the summarizer (see `WorkingContext.replay`).

Summarizers live in `summaries`, semantic measures in `similarity`; both are
re-exported here.  A measure of loss is work for the CPU in proportion to the
whole context (and the offline summarizer's, to what it folds): both run in a
worker thread (`asyncio.to_thread`), never on the event loop, where a fork or
a compression of a long context held every conversation for tens of ms.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Sequence

from opencortex.conversation.entries import Entry, count_tokens
from opencortex.conversation.similarity import (
    EmbeddingSimilarity, LexicalSimilarity, Similarity, similarity_from_name)
from opencortex.conversation.summaries import (
    Summarizer, backend_summarizer, extract_summary, extractive_summarizer, fit_tokens)
from opencortex.ids import random_uuid

__all__ = [
    "STRATEGIES", "CompressionReport", "EmbeddingSimilarity", "Folding", "LexicalSimilarity",
    "Similarity", "Summarizer", "backend_summarizer", "context_text", "extract_summary",
    "extractive_summarizer", "fit_tokens", "fold", "loss_of", "recorded_fold",
    "similarity_from_name", "turn_span",
]

STRATEGIES: tuple[str, ...] = ("sliding", "forget", "summarize", "galois")
SUMMARY_RATIO = 0.25          # summarize: the summary gets about this share of what it folds
GALOIS_RATIOS = (0.25, 0.4, 0.55, 0.7)  # galois: gentler and gentler folds, then all the room
MIN_SUMMARY_TOKENS = 24       # a summary smaller than this says too little to be worth it
MIN_SUMMARY_BODY = 4          # below this many tokens after the header, no summary is made
MAX_SUMMARY_SHARE = 0.25      # a summary takes at most this share of the target


@dataclass(frozen=True)
class CompressionReport:
    """What one compression did, for the user (no silent truncation)."""

    strategy: str
    before_tokens: int
    after_tokens: int
    dropped: tuple[str, ...]      # entry ids removed
    summarized: tuple[str, ...]   # entry ids folded into summaries
    loss: float | None            # semantic loss 0..1
    measure: str | None           # "lexical" or "embedding:<model>"
    notes: str                    # one human sentence: what was folded


@dataclass(frozen=True)
class Folding:
    """The outcome of one strategy: the new entries and what left."""

    entries: list[Entry]
    dropped: tuple[str, ...] = ()
    summarized: tuple[str, ...] = ()
    loss: float | None = None     # set by galois (it measured while choosing)
    note: str = ""                # the strategy's part of the report's sentence
    warnings: tuple[str, ...] = field(default=())


def context_text(entries: Sequence[Entry]) -> str:
    """The text the model would read, for measuring loss."""
    return "\n".join(entry.text for entry in entries)


async def loss_of(similarity: Similarity, reference: str, entries: Sequence[Entry]) -> float:
    """How far ENTRIES' text is from REFERENCE (the context before) by SIMILARITY,
    measured in a worker thread."""
    return await asyncio.to_thread(lambda: similarity.distance(reference,
                                                               context_text(entries)))


def turn_span(entries: Sequence[Entry]) -> str:
    """Turn numbers as ranges, e.g. "2-4, 7" ("" when none has a turn number)."""
    turns = sorted({e.turn for e in entries if e.turn > 0})
    spans: list[str] = []
    start = prev = None
    for turn in turns + [None]:
        if start is not None and (turn is None or turn != prev + 1):
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if turn is not None and start is None:
            start = turn
        prev = turn
    return ", ".join(spans)


def _turns_phrase(entries: Sequence[Entry]) -> str:
    """"turns 2-4, 7", "the earlier summary and turn 9", "3 earlier entries"."""
    summaries = sum(e.kind == "summary" for e in entries)
    span = turn_span([e for e in entries if e.kind != "summary"])
    words = []
    if summaries:
        words.append("the earlier summary" if summaries == 1 else f"{summaries} earlier summaries")
    if span:
        words.append(f"turn{'s' if ('-' in span or ',' in span) else ''} {span}")
    elif not summaries:
        words.append(f"{len(entries)} earlier entr{'y' if len(entries) == 1 else 'ies'}")
    return " and ".join(words)


# ---------------------------------------------------------------- strategies

async def fold(strategy: str, entries: Sequence[Entry], movable: Sequence[bool], target_tokens: int,
               *, summarizer: Summarizer, similarity: Similarity, tolerance: float,
               reference: str) -> Folding:
    """Apply STRATEGY to ENTRIES so that their tokens fit TARGET_TOKENS if possible.

    Only entries whose MOVABLE flag is set may be dropped or folded.
    REFERENCE is the full context's text before this compression (galois
    measures its loss against it).
    """
    if len(entries) != len(movable):
        raise ValueError("entries and movable flags differ in length")
    entries = list(entries)
    if sum(e.tokens for e in entries) <= target_tokens or not any(movable):
        return Folding(entries)
    if strategy == "sliding":
        return _sliding(entries, movable, target_tokens)
    if strategy == "forget":
        return _forget(entries, movable, target_tokens)
    if strategy == "summarize":
        k, allowance = _summary_size(entries, movable, target_tokens, SUMMARY_RATIO)
        return await _summarized(entries, movable, k, allowance, summarizer)
    if strategy == "galois":
        return await _galois(entries, movable, target_tokens, summarizer, similarity, tolerance,
                             reference)
    raise ValueError(f"unknown strategy {strategy!r}; "
                     f"choose one of: {', '.join(sorted(STRATEGIES))}")


def _without(entries: list[Entry], gone: set[int], note: str) -> Folding:
    return Folding([e for i, e in enumerate(entries) if i not in gone],
                   dropped=tuple(entries[i].id for i in sorted(gone)), note=note)


def _sliding(entries: list[Entry], movable: Sequence[bool], target: int) -> Folding:
    """Drop the oldest movable turns (a user message with its replies together) until it fits."""
    groups: dict[object, list[int]] = {}
    for i, entry in enumerate(entries):
        if movable[i]:
            key = entry.turn if entry.turn > 0 and entry.kind == "message" else entry.id
            groups.setdefault(key, []).append(i)
    used, gone = sum(e.tokens for e in entries), set()
    for members in groups.values():  # insertion order: oldest first
        if used <= target:
            break
        gone.update(members)
        used -= sum(entries[i].tokens for i in members)
    removed = [entries[i] for i in sorted(gone)]
    return _without(entries, gone, f"dropped {_turns_phrase(removed)}")


def _forget(entries: list[Entry], movable: Sequence[bool], target: int) -> Folding:
    """Keep only the newest movable entries that fit; cut everything older than the first misfit."""
    room = target - sum(e.tokens for i, e in enumerate(entries) if not movable[i])
    gone: set[int] = set()
    cut = False
    for i in range(len(entries) - 1, -1, -1):
        if not movable[i]:
            continue
        if not cut and entries[i].tokens <= room:
            room -= entries[i].tokens
        else:
            cut = True
            gone.add(i)
    removed = [entries[i] for i in sorted(gone)]
    return _without(entries, gone, f"forgot {_turns_phrase(removed)}")


def _summary_size(entries: list[Entry], movable: Sequence[bool], target: int,
                  ratio: float | None) -> tuple[int, int]:
    """How many of the oldest movable entries to fold, and the summary's token allowance.

    The fewest entries whose summary brings the context to TARGET.  The
    allowance is RATIO of the folded messages plus the whole of an earlier
    summary among them (so a rolling summary grows instead of fading), at least
    MIN_SUMMARY_TOKENS, at most MAX_SUMMARY_SHARE of the target and never more
    than what it replaces.  When no count fits, or RATIO is None: all movable
    entries, with whatever room is left.
    """
    candidates = [i for i, flag in enumerate(movable) if flag]
    used = sum(e.tokens for e in entries)
    cap = max(MIN_SUMMARY_TOKENS, int(MAX_SUMMARY_SHARE * target))
    folded = 0
    wanted = 0.0
    for k, i in enumerate(candidates, start=1):
        entry = entries[i]
        folded += entry.tokens
        if ratio is None:
            continue
        wanted += entry.tokens if entry.kind == "summary" else ratio * entry.tokens
        allowance = min(folded, cap, max(MIN_SUMMARY_TOKENS, math.ceil(wanted)))
        if used - folded + allowance <= target:
            return k, allowance
    return len(candidates), max(0, min(cap, target - (used - folded)))


async def _summarized(entries: list[Entry], movable: Sequence[bool], k: int, allowance: int,
                      summarizer: Summarizer) -> Folding:
    """Fold the K oldest movable entries into one summary entry of at most ALLOWANCE tokens."""
    chosen = [i for i, flag in enumerate(movable) if flag][:k]
    folded = [entries[i] for i in chosen]
    header = _header(folded)
    body_allowance = allowance - count_tokens(header)
    if body_allowance < MIN_SUMMARY_BODY:
        return _without(entries, set(chosen),
                        f"dropped {_turns_phrase(folded)} (no room left for a summary)")
    body = fit_tokens((await summarizer(folded, body_allowance)).strip(), body_allowance)
    text = fit_tokens(header + body, allowance)
    return _folded_into(entries, chosen, text, f"summary:{random_uuid()}")


def _header(folded: Sequence[Entry]) -> str:
    """"[Summary of turns 2-4] ": what a summary of FOLDED starts with."""
    turns = [e.turn for e in folded if e.turn > 0]
    first, last = (min(turns), max(turns)) if turns else (0, 0)
    span = "earlier messages" if not turns else f"turn {first}" if first == last \
        else f"turns {first}-{last}"
    return f"[Summary of {span}] "


def _covered(entry: Entry) -> tuple[str, ...]:
    """The ids of the messages ENTRY stands for: its own, or those a summary covers."""
    return entry.covers if entry.kind == "summary" and entry.covers else (entry.id,)


def _folded_into(entries: list[Entry], chosen: list[int], text: str, entry_id: str) -> Folding:
    """ENTRIES with those at CHOSEN (indexes, oldest first) replaced by one summary
    entry ENTRY_ID saying TEXT, where the first of them was."""
    folded = [entries[i] for i in chosen]
    turns = [e.turn for e in folded if e.turn > 0]
    covers = tuple(dict.fromkeys(i for entry in folded for i in _covered(entry)))
    summary = Entry(id=entry_id, role="system", text=text, turn=min(turns) if turns else 0,
                    retention="REQUIRED", kind="summary", tokens=max(1, count_tokens(text)),
                    covers=covers)
    gone = set(chosen)
    result: list[Entry] = []
    for i, entry in enumerate(entries):
        if i == chosen[0]:
            result.append(summary)
        if i not in gone:
            result.append(entry)
    return Folding(result, summarized=tuple(e.id for e in folded),
                   note=f"summarised {_turns_phrase(folded)}")


def _sizes(strategy: str, entries: list[Entry], movable: Sequence[bool],
           target: int) -> list[tuple[int, int]]:
    """The (count, allowance) folds STRATEGY may choose among, gentlest last."""
    ratios = (SUMMARY_RATIO,) if strategy == "summarize" else (*GALOIS_RATIOS, None)
    sizes: list[tuple[int, int]] = []
    for ratio in ratios:
        size = _summary_size(entries, movable, target, ratio)
        if size not in sizes:
            sizes.append(size)
    return sizes


def recorded_fold(strategy: str, entries: Sequence[Entry], movable: Sequence[bool],
                  target: int, recorded: Entry) -> Folding | None:
    """The fold summarize or galois made of ENTRIES when it made RECORDED (a kept summary:
    its first and last covers are the first and last message it folded), made again
    with RECORDED's text and id: the oldest movable entries up to the one covering
    its last message.  None when STRATEGY would not fold, or not that way (the
    entries differ from the ones it was made of, or it is no size STRATEGY picks)."""
    entries = list(entries)
    if strategy not in ("summarize", "galois") or not recorded.covers or not any(movable) \
            or sum(e.tokens for e in entries) <= target:
        return None
    candidates = [i for i, flag in enumerate(movable) if flag]
    first, last = recorded.covers[0], recorded.covers[-1]
    count = next((n for n, i in enumerate(candidates, start=1)
                  if last in _covered(entries[i])), None)
    if count is None or first not in _covered(entries[candidates[0]]):
        return None
    header = _header([entries[i] for i in candidates[:count]])
    needs = max(count_tokens(recorded.text), count_tokens(header) + MIN_SUMMARY_BODY)
    sizes = _sizes(strategy, entries, movable, target)
    if not recorded.text.startswith(header) or all(
            k != count or allowance < needs for k, allowance in sizes):
        return None
    return _folded_into(entries, candidates[:count], recorded.text, recorded.id)


async def _galois(entries: list[Entry], movable: Sequence[bool], target: int,
                  summarizer: Summarizer, similarity: Similarity, tolerance: float,
                  reference: str) -> Folding:
    """Summarize, measuring the loss; step to gentler folds while it exceeds TOLERANCE."""
    best: tuple[float, Folding] | None = None
    for step, (k, allowance) in enumerate(_sizes("galois", entries, movable, target)):
        candidate = await _summarized(entries, movable, k, allowance, summarizer)
        loss = await loss_of(similarity, reference, candidate.entries)
        if best is None or loss < best[0]:
            best = (loss, candidate)
        if loss <= tolerance:
            gentler = f" after {step} gentler step{'s' if step != 1 else ''}" if step else ""
            return Folding(candidate.entries, candidate.dropped, candidate.summarized, loss,
                           f"{candidate.note}{gentler}")
    assert best is not None
    loss, candidate = best
    return Folding(candidate.entries, candidate.dropped, candidate.summarized, loss,
                   candidate.note, warnings=(f"the loss stays above the {tolerance:g} tolerance "
                                             "even at the gentlest fold that fits",))

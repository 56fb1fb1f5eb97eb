"""The working context: what the model sees for one branch of one thread.

Entries are kept oldest first, PRESERVED ones in place.  When the tokens in
use pass `threshold` of the budget, the context compresses down to `target`:
DROPPABLE entries go first (oldest first), then the strategy folds REQUIRED
ones (oldest first); PRESERVED entries and the newest turn (the last user
message and everything after it) are never touched.

Hysteresis: after a compression that ended at U tokens, `add` compresses again
only when the pressure is above the threshold AND the context has grown past
U + (threshold - target) * budget.  Normally U <= target, so that is simply
"passes the threshold again"; a context stuck above the threshold (PRESERVED
entries too large) compresses once per band of new tokens, not on every add.
Unpinning or changing the strategy lifts the wait (there may be room now).
Every compression returns a `CompressionReport` saying what was folded.
`mark` says where the context starts on its branch, for the checkpoint a turn
writes: a restart restores exactly these entries (see `restoredcontext`), and
`replay` has the next compression fold as a kept summary says one did, with
its text, so that a restart takes the checkpoint's turn without asking the
summarizer again.

Nothing here reads the archive: the caller builds the entries (from the
thread log, recall, the persona) and adds them.  Logs carry counts and ids,
never message text.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import KeysView, Sequence
from typing import Literal, NamedTuple

from opencortex.conversation.checkpoint import ContextMark
from opencortex.conversation.compression import (
    STRATEGIES, CompressionReport, Folding, Similarity, Summarizer, context_text,
    extractive_summarizer, fold, loss_of, recorded_fold)
from opencortex.conversation.entries import Entry, Retention, count_tokens, default_retention
from opencortex.conversation.similarity import LexicalSimilarity, similarity_from_name

__all__ = ["ContextState", "CompressionReport", "WorkingContext", "STRATEGIES"]

log = logging.getLogger(__name__)

ContextState = Literal["empty", "accumulating", "pressured", "compressed"]
PREVIEW_CHARS = 80


class _Known(NamedTuple):
    """What a context's entries hold, for the entries list and length it was made for
    (a turn asks for these without going through every entry)."""

    entries: list[Entry]
    length: int
    ids: dict[str, None]          # the entries' ids
    seen: dict[str, None]         # those and the ids their summaries cover
    summaries: tuple[str, ...]    # the summaries' ids, in order


def _summary_ids(entries: Sequence[Entry]) -> tuple[str, ...]:
    """The ids of the summaries among ENTRIES, in order."""
    return tuple(entry.id for entry in entries if entry.kind == "summary")


class WorkingContext:
    """What the model sees for one branch of one thread: preserved entries, then the rest."""

    def __init__(self, *, budget: int = 8000, threshold: float = 0.8, target: float = 0.6,
                 strategy: str = "sliding", summarizer: Summarizer | None = None,
                 similarity: Similarity | None = None, tolerance: float = 0.25):
        if not isinstance(budget, int) or budget <= 0:
            raise ValueError(
                f"the context budget must be a positive number of tokens, not {budget!r}")
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold {threshold!r} must be in (0, 1] (e.g. 0.8)")
        if not 0 < target < threshold:
            raise ValueError(f"target {target!r} must be above 0 and below the threshold "
                             f"{threshold!r} (e.g. 0.6), or compressions would thrash")
        if not 0 <= tolerance <= 1:
            raise ValueError(f"tolerance {tolerance!r} must be in [0, 1] (e.g. 0.25)")
        self.budget = budget
        self.threshold = threshold
        self.target = target
        self.tolerance = tolerance
        self.summarizer: Summarizer = summarizer or extractive_summarizer
        self.similarity: Similarity = similarity or LexicalSimilarity()
        self.strategy = "sliding"
        self._rearm_above = -1
        self.set_strategy(strategy)
        self.entries: list[Entry] = []
        self._ids: _Known | None = None
        self.last_report: CompressionReport | None = None
        self.compressions = 0
        self._smalltalk_gone: Entry | None = None   # the newest small talk compression let go
        self._unpinned: set[str] = set()            # messages unpinned in place, maybe gone
        self._recorded: tuple[Entry, ...] = ()      # kept summaries a fold may make again
        self._used = 0
        # Hysteresis: after a compression ending at U tokens, `add` compresses again only
        # above U + (threshold - target) * budget (normally that is just "above the threshold").
        self._band = max(1, int(threshold * budget) - self.target_tokens)
        self._rearm_above = -1

    @classmethod
    def from_settings(cls, settings, *, summarizer: Summarizer | None = None,
                      similarity: Similarity | None = None) -> "WorkingContext":
        """A context configured by a `ConversationSettings`."""
        return cls(budget=settings.budget, threshold=settings.threshold, target=settings.target,
                   strategy=settings.strategy, summarizer=summarizer,
                   similarity=similarity or similarity_from_name(settings.similarity),
                   tolerance=settings.tolerance)

    # ------------------------------------------------------------ measures

    @property
    def used(self) -> int:
        """Tokens the entries take."""
        return self._used

    @property
    def pressure(self) -> float:
        """used / budget."""
        return self._used / self.budget

    @property
    def target_tokens(self) -> int:
        return int(self.target * self.budget)

    @property
    def state(self) -> ContextState:
        """empty, pressured (above the threshold), compressed (folded before) or accumulating."""
        if not self.entries:
            return "empty"
        if self.pressure > self.threshold:
            return "pressured"
        return "compressed" if self.compressions else "accumulating"

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._known().ids

    def seen_ids(self) -> KeysView[str]:
        """The ids of the entries and of the messages their summaries cover: what the
        model sees already, which recall leaves out (a read-only view, kept up to date
        as entries are added, not rebuilt each turn)."""
        return self._known().seen.keys()

    def _known(self) -> _Known:
        """The ids the entries hold, made again when the entries list was replaced or
        changed length other than by `add` (which keeps them up to date)."""
        known = self._ids
        if known is None or known.entries is not self.entries or \
                known.length != len(self.entries):
            ids = dict.fromkeys(entry.id for entry in self.entries)
            seen = {**ids, **dict.fromkeys(o for entry in self.entries for o in entry.covers)}
            known = self._ids = _Known(self.entries, len(self.entries), ids, seen,
                                       _summary_ids(self.entries))
        return known

    # ------------------------------------------------------------ changes

    async def add(self, *entries: Entry) -> CompressionReport | None:
        """Append ENTRIES (oldest first); compress when the pressure passes the threshold.

        Returns the report of that compression, or None when none was needed
        (or the hysteresis held it back).  An id already present is a ValueError.
        """
        known = self._known()
        ids, seen = known.ids, known.seen
        adding: set[str] = set()
        for entry in entries:
            if entry.id in ids or entry.id in adding:
                raise ValueError(f"entry {entry.id!r} is already in the context")
            adding.add(entry.id)
        for entry in entries:
            if entry.tokens == 0 and entry.text:
                entry = dataclasses.replace(entry, tokens=count_tokens(entry.text))
            self.entries.append(entry)
            self._used += entry.tokens
            ids[entry.id] = seen[entry.id] = None
            seen.update(dict.fromkeys(entry.covers))
        self._ids = _Known(self.entries, len(self.entries), ids, seen,
                           known.summaries + _summary_ids(entries))
        if self.pressure <= self.threshold or self._used <= self._rearm_above:
            return None
        return await self.compress()

    async def compress(self) -> CompressionReport:
        """Bring the pressure to the target if the untouchable entries allow; report what went."""
        before = list(self.entries)
        before_tokens = self._used
        target = self.target_tokens
        reference = context_text(before)
        protected = self._protected()

        kept: list[Entry] = []
        kept_protected: list[bool] = []
        dropped: list[Entry] = []
        used = before_tokens
        for entry, fixed in zip(before, protected):  # DROPPABLE first, oldest first
            if used > target and entry.retention == "DROPPABLE" and not fixed:
                dropped.append(entry)
                used -= entry.tokens
            else:
                kept.append(entry)
                kept_protected.append(fixed)
        movable = [e.retention == "REQUIRED" and not fixed
                   for e, fixed in zip(kept, kept_protected)]
        folding = self._recorded_fold(kept, movable, target)
        if folding is None:
            folding = await fold(self.strategy, kept, movable, target,
                                 summarizer=self.summarizer, similarity=self.similarity,
                                 tolerance=self.tolerance, reference=reference)
        self.entries = folding.entries
        self._used = sum(entry.tokens for entry in self.entries)
        changed = bool(dropped or folding.dropped or folding.summarized)
        loss = folding.loss
        if loss is None and changed:
            loss = await loss_of(self.similarity, reference, self.entries)
        fixed = sum(e.tokens for e, untouchable in zip(before, protected) if untouchable)
        report = CompressionReport(
            strategy=self.strategy, before_tokens=before_tokens, after_tokens=self._used,
            dropped=tuple(e.id for e in dropped) + folding.dropped,
            summarized=folding.summarized, loss=loss if changed else None,
            measure=self.similarity.name if changed else None,
            notes=self._notes(dropped, folding.note, folding.warnings, before_tokens, fixed,
                              changed, loss))
        self.last_report = report
        if changed:
            self.compressions += 1
        self.note_smalltalk_gone(dropped)
        self._rearm_above = self._used + self._band
        log.info("context compressed by %s: %d -> %d tokens, %d dropped, %d summarised",
                 self.strategy, before_tokens, self._used, len(report.dropped),
                 len(report.summarized))
        return report

    def note_smalltalk_gone(self, dropped: list[Entry]) -> None:
        """Remember the newest small-talk message of DROPPED (oldest first), unless one of
        a later turn went before (an entry unpinned since may be older)."""
        messages = [entry for entry in dropped if entry.kind == "message"]
        newest = self._smalltalk_gone
        if messages and (newest is None or messages[-1].turn >= newest.turn):
            self._smalltalk_gone = messages[-1]

    def mark(self) -> ContextMark:
        """Where this context starts on its branch (see `ContextMark`): its oldest message
        neither pinned nor unpinned in place, the newest small talk compression let go
        (forgotten once older than that message's turn), the tokens to pass before
        compressing again, the messages unpinned in place and the summaries.
        From that oldest message on, every REQUIRED message of the branch is here
        (compressions fold the oldest first), and so is every DROPPABLE one after that
        small talk (they go oldest first)."""
        if self._unpinned:
            self._unpinned.intersection_update(
                entry.id for entry in self.entries if entry.retention != "PRESERVED")
        oldest = next((entry for entry in self.entries if entry.kind == "message" and
                       entry.retention != "PRESERVED" and entry.id not in self._unpinned), None)
        gone = self._smalltalk_gone
        if gone is not None and (oldest is None or gone.turn < oldest.turn):
            gone = self._smalltalk_gone = None      # older than the context: it says nothing
        return ContextMark(oldest=oldest.id if oldest is not None else None,
                           smalltalk=gone.id if gone is not None else None,
                           above=self._rearm_above if self._rearm_above >= 0 else None,
                           unpinned=frozenset(self._unpinned),
                           summaries=self._known().summaries)

    def resume(self, mark: ContextMark, smalltalk_gone: Entry | None) -> None:
        """Continue, empty still, from a checkpoint's MARK: the newest small talk let go
        was SMALLTALK_GONE (the message it names), it compresses again only above the
        tokens it says, and the messages it names as unpinned in place are that still."""
        if smalltalk_gone is not None:
            self.note_smalltalk_gone([smalltalk_gone])
        if mark.above is not None:
            self._rearm_above = mark.above
        self._unpinned.update(mark.unpinned)

    def replay(self, recorded: Sequence[Entry]) -> None:
        """Have compressions by summarize or galois fold as the first of RECORDED (kept
        summary entries, their covers naming the first and last message each folded)
        did that is a fold the strategy may make of the entries, with its text and
        id; as the strategy says when none is (or RECORDED is empty).  A restart uses
        it to take a turn as the live context took it, without the summarizer."""
        self._recorded = tuple(recorded)

    def _recorded_fold(self, entries: list[Entry], movable: list[bool],
                       target: int) -> Folding | None:
        """The fold of ENTRIES the first kept summary given to `replay` makes again, or
        None (see `compression.recorded_fold`)."""
        for recorded in self._recorded:
            folding = recorded_fold(self.strategy, entries, movable, target, recorded)
            if folding is not None:
                return folding
        return None

    def rename(self, entry_id: str, new_id: str) -> bool:
        """Give entry ENTRY_ID the id NEW_ID (a summary, once kept, is known by its
        record's); False when it is not here."""
        for i, entry in enumerate(self.entries):
            if entry.id == entry_id:
                self.entries[i] = dataclasses.replace(entry, id=new_id)
                self._ids = None
                return True
        return False

    def _protected(self) -> list[bool]:
        """True for entries no compression may touch: PRESERVED ones and the newest turn.

        The newest turn starts at the last user message (or, when there is
        none, the last message) and runs to the end.
        """
        messages = [i for i, e in enumerate(self.entries) if e.kind == "message"]
        users = [i for i in messages if self.entries[i].role == "user"]
        newest = users[-1] if users else messages[-1] if messages else len(self.entries)
        return [e.retention == "PRESERVED" or i >= newest for i, e in enumerate(self.entries)]

    def _notes(self, dropped: list[Entry], folded: str, warnings: tuple[str, ...], before: int,
               fixed: int, changed: bool, loss: float | None) -> str:
        parts: list[str] = []
        small_talk = [e for e in dropped if e.kind != "recalled"]
        recalled = len(dropped) - len(small_talk)
        if small_talk:
            parts.append(f"dropped {_count(len(small_talk), 'small-talk message')}")
        if recalled:
            parts.append(f"dropped {_count(recalled, 'recalled memory', 'recalled memories')}")
        if folded:
            parts.append(folded)
        if not parts:
            parts.append("nothing to fold" if before <= self.target_tokens
                         else "nothing could be folded")
        sentence = ", ".join(parts)
        sentence = sentence[0].upper() + sentence[1:]
        sentence += f" ({before:,} → {self._used:,} tokens"
        if changed and loss is not None:
            sentence += f"; {self.similarity.name} loss {loss:.2f}"
        sentence += ")"
        extra = list(warnings)
        if self._used > self.target_tokens:
            extra.append("still above the target: preserved entries and the newest turn alone "
                         f"take {fixed:,} tokens of the {self.target_tokens:,}-token target")
        return sentence + "".join(f"; {w}" for w in extra) + "."

    def pin(self, entry_id: str) -> bool:
        """Make ENTRY_ID PRESERVED; False when it is not in the context."""
        return self._set_retention(entry_id, lambda entry: "PRESERVED")

    def unpin(self, entry_id: str) -> bool:
        """Give a pinned entry back its default retention; False when absent or not pinned.

        Persona and system entries are PRESERVED by their kind and stay so.
        """
        def natural(entry: Entry) -> Retention | None:
            if entry.retention != "PRESERVED" or entry.kind in ("persona", "system"):
                return None
            if entry.kind == "recalled":
                return "DROPPABLE"
            if entry.kind == "summary":
                return "REQUIRED"
            return default_retention(entry.role, entry.text, entry.turn_type)
        changed = self._set_retention(entry_id, natural)
        if changed:
            self.lift()             # the room compression may use changed
            self._unpinned.add(entry_id)
        return changed

    def lift(self) -> None:
        """Compress at the next add past the threshold, whatever the wait."""
        self._rearm_above = -1

    def _set_retention(self, entry_id: str, new) -> bool:
        for i, entry in enumerate(self.entries):
            if entry.id == entry_id:
                retention = new(entry)
                if retention is None:
                    return False
                self.entries[i] = dataclasses.replace(entry, retention=retention)
                return True
        return False

    def set_strategy(self, name: str) -> None:
        """Use strategy NAME from now on (ValueError listing the names for unknown ones);
        another strategy than the one in use lifts the wait."""
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; choose one of: "
                             f"{', '.join(sorted(STRATEGIES))}")
        if name != self.strategy:
            self.strategy = name
            self.lift()

    def view(self) -> list[dict]:
        """The entries for /context: id, turn, role, retention, kind, tokens and a preview."""
        rows = []
        for entry in self.entries:
            preview = " ".join(entry.text.split())
            if len(preview) > PREVIEW_CHARS:
                preview = preview[:PREVIEW_CHARS - 1] + "…"
            rows.append({"id": entry.id, "turn": entry.turn, "role": entry.role,
                         "retention": entry.retention, "kind": entry.kind,
                         "tokens": entry.tokens, "text": preview})
        return rows


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"

"""Conversations: per thread, the log (branches), the working context and the session.

Everything here is rebuilt from the org archive on first use after a start:
the thread log resumes from the tail of the thread's file (see `resume`; the
whole thread is replayed only when the tail cannot tell); the working context
is filled as the newest checkpoint says it was (see `restoredcontext`), or
from the newest messages of the current branch (plus pinned ones), so its cost
follows the budget, not the length of the thread.  After that each turn only
appends, with a checkpoint for the next start that says where the context
started.

The event loop does not wait for the disk: opening a thread (reading its
file's tail) and recall (the index query) run in reading threads, and a turn
is written by the archive's writer thread in a group commit with the turns of
other threads that finish meanwhile (see `memory.writer`); `record_turn`
returns once the turn is durable.

Summaries the context makes are kept in the thread's file (`storedsummaries`),
and the context knows each by its record's id from then on: the checkpoint
names those the context holds, so a start puts them back (and takes the turn
that made one again from the one kept, without the summarizer); without such
a checkpoint, with the summarize and galois strategies, a start puts the
newest summary of the branch back, followed by the messages after it, and the
summarizer is asked again only when those no longer fit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Awaitable, Callable, Collection, Iterable, Sequence

from opencortex.conversation.checkpoint import ContextMark, checkpoint_message
from opencortex.conversation.checkpointscan import scan_checkpoint
from opencortex.conversation.compression import CompressionReport
from opencortex.conversation.context import WorkingContext
from opencortex.conversation.delivery import DELIVERY, FAILED, as_seen
from opencortex.conversation.entries import Entry, count_tokens, default_retention
from opencortex.conversation.recall import Recall, owner_of
from opencortex.conversation.saved import SavedSessions
from opencortex.conversation.session import Session
from opencortex.conversation.settings import ConversationSettings
from opencortex.conversation.restoredcontext import fill, restored
from opencortex.conversation.storedsummaries import ID_PREFIX, summary_message
from opencortex.conversation.summaries import on_loop
from opencortex.conversation.threadlog import ThreadLog
from opencortex.events import Thread
from opencortex.memory import Archive, ArchiveError, MessageRecord, NewMessage
from opencortex.memory.retention import count_forgettable, forget
from opencortex.memory.working import WorkingMemory
from opencortex.workers import Workers

log = logging.getLogger(__name__)

WhenDurable = Callable[[list[MessageRecord]], Awaitable[None]]   # given a turn's records

WINDOW_MESSAGES = 400  # newest messages of a branch read into a fresh context, at most
OPEN_CONVERSATIONS = 256  # kept in memory; the least recently used idle one is let go
READERS = 2   # threads that read the archive for recall and opening (SQLite runs without
              # the GIL; more threads would only make the loop wait longer for it)


def checkpoint_threads(archive: Archive, threads: Iterable[Thread]) -> int:
    """Write a checkpoint at the end of each of THREADS (filled by other means, such as
    `memory import`), so that a start resumes each from its file's tail instead of
    reading it whole; how many were written.  Each checkpoint is worked out by counting
    (`scan_checkpoint`: memory does not grow with the thread), or, when counts cannot
    tell (its branches changed since its last checkpoint), by opening the thread as a
    start would.  A thread whose branch fits in the window a start reads gets none:
    it is read whole at no cost."""
    written = 0
    for thread in threads:
        scanned = scan_checkpoint(archive, thread)
        if scanned is not None and (scanned.exact or scanned.messages > WINDOW_MESSAGES):
            if scanned.messages > WINDOW_MESSAGES:
                archive.append([checkpoint_message(thread, scanned.checkpoint)])
                written += 1
            continue
        log = ThreadLog.resume(archive, thread, window=WINDOW_MESSAGES)
        if len(log.entries(limit=WINDOW_MESSAGES + 1)) > WINDOW_MESSAGES:
            written += log.write_checkpoint() is not None
    return written


def shown_to_model(role: str, turn_type: str) -> bool:
    """System errors stay in the archive; tool results and approval outcomes are shown."""
    return role != "system" or turn_type in ("action", "yield")


@dataclass
class Conversation:
    """One thread's live state."""

    thread: Thread
    log: ThreadLog
    context: WorkingContext
    session: Session
    recalled: list[Entry] = field(default_factory=list)  # brought in for the latest turn
    kept_summaries: set[str] = field(default_factory=set)  # summary entries in the archive
    unkept_summaries: set[str] = field(default_factory=set)  # ... the archive did not take
    undelivered: set[str] = field(default_factory=set)  # of the turn being recorded


class Conversations:
    """The conversations of one kernel, opened lazily, by thread."""

    def __init__(self, archive: Archive, settings: ConversationSettings, *,
                 summarizer: Any = None, unarchived: Collection[str] = ()):
        self.archive = archive
        self.unarchived = frozenset(unarchived)   # channels kept in working memory only
        self.working = WorkingMemory()
        self.settings = settings
        self.summarizer = summarizer
        self.recall = Recall(archive, settings.owners, settings.recall_across_owners)
        self.saved = SavedSessions(archive.root, owners=settings.owners, archive=archive)
        self._open: OrderedDict[Thread, Conversation] = OrderedDict()  # least recent first
        self._opening: dict[Thread, asyncio.Future[Conversation]] = {}   # being loaded
        self._readers = Workers(READERS, "opencortex-reader")   # made on first use

    def store_for(self, thread: Thread) -> Archive | WorkingMemory:
        """Where THREAD's messages are kept: the archive, or working memory only for a
        channel configured with `archive = false`."""
        return self.working if thread.channel in self.unarchived else self.archive

    def owner(self, thread: Thread) -> str:
        return owner_of(thread, self.settings.owners)

    async def open(self, thread: Thread) -> Conversation:
        """The conversation of THREAD, loading it from the archive the first time (in a
        reading thread; callers asking for the same thread meanwhile share the load)."""
        conversation = self._open.get(thread)
        if conversation is not None:
            self._open.move_to_end(thread)
            return conversation
        opening = self._opening.get(thread)
        if opening is None:
            opening = self._opening[thread] = asyncio.ensure_future(self._load(thread))
            opening.add_done_callback(partial(self._opened, thread))
        return await asyncio.shield(opening)

    def _opened(self, thread: Thread, done: asyncio.Future) -> None:
        """THREAD's load ended (its outcome went to whoever awaited it)."""
        if self._opening.get(thread) is done:
            del self._opening[thread]
        if not done.cancelled():
            done.exception()        # retrieved: a load nobody awaits any more is not an error

    async def _load(self, thread: Thread) -> Conversation:
        """THREAD's conversation read from its store, its context filled, kept open."""
        store = self.store_for(thread)
        if isinstance(store, Archive):
            thread_log = await self.read(ThreadLog.resume, store, thread,
                                         window=WINDOW_MESSAGES)
        else:
            thread_log = ThreadLog.resume(store, thread, window=WINDOW_MESSAGES)
        session = Session.from_log(thread_log, max_turns=self.settings.max_turns,
                                   max_tokens=self.settings.max_tokens)
        conversation = Conversation(thread, thread_log, self._chosen_context(thread_log),
                                    session)
        await self.refill(conversation)
        self._open[thread] = conversation
        self._let_go()
        return conversation

    async def read(self, function, *args, **kwargs):
        """FUNCTION(*ARGS, **KWARGS) run by a reading thread, so the loop does not wait."""
        return await self._readers.run(function, *args, **kwargs)

    async def read_within(self, limit: float, function, *args, **kwargs):
        """`read`, given up after LIMIT seconds (TimeoutError): for skills' code, which may
        hang; its thread is replaced (see `workers`)."""
        return await self._readers.run_within(limit, function, *args, **kwargs)

    def close(self) -> None:
        """Let the reading threads go (made again if the conversations are used after)."""
        self._readers.shutdown()

    def _let_go(self) -> None:
        """Keep memory bounded: idle conversations beyond the limit are rebuilt when next used."""
        idle = [t for t, c in self._open.items() if c.session.state in ("dormant", "ready")]
        for thread in idle[:max(0, len(self._open) - OPEN_CONVERSATIONS)]:
            del self._open[thread]

    def _new_context(self) -> WorkingContext:
        return WorkingContext.from_settings(self.settings, summarizer=self.summarizer)

    def _chosen_context(self, thread_log: ThreadLog) -> WorkingContext:
        """A new context with the strategy /strategy chose for the thread, if any."""
        context = self._new_context()
        if thread_log.strategy:
            try:
                context.set_strategy(thread_log.strategy)
            except ValueError:
                log.warning("thread %s keeps an unknown strategy; using %s", thread_log.thread,
                            context.strategy)
        return context

    async def refill(self, conversation: Conversation) -> CompressionReport | None:
        """A fresh working context for the current branch (after a start, fork, rewind, …).
        Off the loop: reading the log (a pin or summary older than the tail makes it
        read whole), and filling the context, which compresses up to a window of
        messages (a thread of its own, on a loop of its own; a summary a backend makes
        is asked for on this loop)."""
        strategy = conversation.context.strategy
        summarizer = self.summarizer and on_loop(self.summarizer, asyncio.get_running_loop())
        context = WorkingContext.from_settings(self.settings, summarizer=summarizer)
        context.set_strategy(strategy)
        found = await self.read(restored, conversation.log, strategy, WINDOW_MESSAGES)
        conversation.kept_summaries.update(found.kept_ids())
        entries = [e for e in found.entries() if e.kind == "summary" or
                   shown_to_model(e.role, e.turn_type)]
        gone = await self.read(self.store_for(conversation.thread).undelivered,
                               [e.id for e in entries if e.kind == "message"])
        entries = [replace(e, text=as_seen(e.text, True), tokens=0) if e.id in gone else e
                   for e in entries]
        report = await asyncio.to_thread(asyncio.run, fill(
            context, found, entries, configured=self.settings.strategy))
        conversation.context = context
        if await self._keep_summaries(conversation) and found.window.mark is None:
            await self._checkpoint(conversation)
        return report

    async def _checkpoint(self, conversation: Conversation) -> None:
        """Write a checkpoint of CONVERSATION's context as it is (never fatal): filled
        without one and a summary made then, a start would not fill it so again."""
        mark = self._mark(conversation)
        try:
            if mark is not None:
                await conversation.log.write_checkpoint_async(mark)
        except ArchiveError as error:
            log.warning("could not write a checkpoint of %s (%s)", conversation.thread,
                        type(error).__name__)

    async def _keep_summaries(self, conversation: Conversation) -> int:
        """Archive the summaries the context made since the last call (never fatal); each
        kept one is known by its record's id from then on (`StoredSummary.entry_id`).
        How many were made."""
        kept, unkept = conversation.kept_summaries, conversation.unkept_summaries
        made = [entry for entry in conversation.context.entries if entry.kind == "summary"
                and entry.id not in kept and entry.id not in unkept]
        for entry in made:
            try:
                record = await conversation.log.keep_summary_async(
                    self._summary_record(conversation, entry))
            except (ArchiveError, ValueError) as error:
                log.warning("could not keep a summary of %s (%s)", conversation.thread,
                            type(error).__name__)
                unkept.add(entry.id)
                continue
            if conversation.context.rename(entry.id, ID_PREFIX + record.id):
                kept.add(ID_PREFIX + record.id)
        held = {entry.id for entry in conversation.context.entries if entry.kind == "summary"}
        kept.intersection_update(held)
        unkept.intersection_update(held)
        return len(made)

    @staticmethod
    def _summary_record(conversation: Conversation, entry: Entry) -> NewMessage:
        """The record that keeps summary ENTRY of CONVERSATION's context."""
        thread_log = conversation.log
        last = thread_log.turn_of(entry.covers[-1]) if entry.covers else None
        first = entry.turn or last or 0
        turns = f"{first}-{last}" if last and last != first else str(first)
        covers = set(entry.covers)
        kept = sorted(i for i in thread_log.pins() if i not in covers and
                      first <= (thread_log.turn_of(i) or -1) <= (last or first))
        return summary_message(conversation.thread, entry,
                               strategy=conversation.context.strategy,
                               branch=thread_log.branch, turns=turns, kept=kept)

    @staticmethod
    def _mark(conversation: Conversation) -> ContextMark | None:
        """Where CONVERSATION's context starts, for the checkpoint of its next turn; None
        (not known) when it holds a summary that could not be kept."""
        mark = conversation.context.mark()
        return mark if set(mark.summaries) <= conversation.kept_summaries else None

    async def forget(self, thread: Thread, *, apply: bool) -> int:
        """How many messages of THREAD forgetting removes; with APPLY they are removed
        from the archive and its index (by a reading thread), and the live conversation
        is let go (it is rebuilt, empty, when next used)."""
        if thread.channel in self.unarchived:
            raise ValueError("this chat is kept in working memory only: nothing of it is "
                             "in the archive, and it goes when the kernel stops")
        if not apply:
            return await self.read(count_forgettable, self.archive, thread)
        removed = await self.read(forget, self.archive, thread)
        self._open.pop(thread, None)
        return removed

    def recall_for(self, thread: Thread, query: str, seen: Collection[str]) -> list[Entry]:
        """Recall for THREAD's coming turn (in a reading thread): same owner only, nothing
        in SEEN (what its context holds already, see `WorkingContext.seen_ids`)."""
        if self.settings.recall_k <= 0:
            return []
        try:
            return self.recall.recall(thread, query, k=self.settings.recall_k,
                                      exclude_ids=seen)
        except ValueError:
            return []
        except Exception as error:   # a fault in recall must not lose the person's message
            log.error("recall failed (%s); the turn goes on without recalled messages",
                      type(error).__name__)
            return []

    async def mark_undelivered(self, thread: Thread, message_id: str, why: str) -> None:
        """Archive that MESSAGE_ID of THREAD's turn being recorded never reached the person
        (WHY: what the platform said; see `delivery`): the context takes it so marked.
        Called from `record_turn`'s DURABLE hook; never fatal."""
        conversation = await self.open(thread)
        conversation.undelivered.add(message_id)
        try:
            await self.read(conversation.log.mark_undelivered, message_id, why)
        except (ArchiveError, ValueError) as error:
            log.warning("could not mark an undelivered reply of %s (%s)", thread,
                        type(error).__name__)

    async def record_turn(self, thread: Thread, messages: Sequence[NewMessage],
                          metrics: dict[str, str], *, pin: bool = False,
                          durable: WhenDurable | None = None
                          ) -> tuple[list[MessageRecord], CompressionReport | None]:
        """Archive one turn on the current branch and add it to the working context;
        with PIN the turn is pinned (PRESERVED), as `/pin` would pin it.  DURABLE is
        awaited (with the turn's records) as soon as the turn's write is durable,
        before pinning and any compression (the reply is said there: never before
        its fsync, never after a summarizer's call)."""
        conversation = await self.open(thread)
        before = conversation.context.used
        added = sum(count_tokens(m.text) for m in messages
                    if shown_to_model(m.role, m.turn_type))
        extra = {**metrics, "CONTEXT_BEFORE": str(before), "CONTEXT_AFTER": str(before + added),
                 "TURN": str(conversation.log.turn_count() + 1)}
        batch = [m.model_copy(update={"extra": {**m.extra, **extra}}) if m.role != "user" else m
                 for m in messages]
        records = await conversation.log.append_turn_async(
            batch, checkpoint=True, context=self._mark(conversation))
        if durable is not None:
            await durable(records)
        turn = conversation.log.turn_count()
        gone = {r.id for r in records if r.id in conversation.undelivered or
                r.extra.get(DELIVERY) == FAILED}
        conversation.undelivered -= gone
        if pin:                         # control records: written off the loop too
            await self.read(lambda: [conversation.log.pin(record.id) for record in records])
        report = await conversation.context.add(*[
            Entry(id=r.id, role=r.role, text=as_seen(r.text, r.id in gone), turn=turn,
                  turn_type=r.turn_type,
                  retention="PRESERVED" if pin else default_retention(r.role, r.text,
                                                                     r.turn_type))
            for r in records if shown_to_model(r.role, r.turn_type)])
        if report is not None:          # summaries are made by compressions alone
            await self._keep_summaries(conversation)
        tokens = int(metrics.get("TOKENS_IN", 0) or 0) + int(metrics.get("TOKENS_OUT", 0) or 0)
        reason = conversation.session.count_turn(tokens, max_turns=self.settings.max_turns,
                                                 max_tokens=self.settings.max_tokens)
        if reason:
            log.info("session %s collapsed", thread)
        return records, report

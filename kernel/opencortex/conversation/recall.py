"""Recall: earlier messages brought back into a prompt, never across owners.

An owner is who is talking.  The person at this machine is one owner
("local") across Emacs and the terminal; every bridge chat (a Telegram user,
a Telegram group, a Signal contact, a Matrix room) is an owner of its own,
named after its thread ("telegram:123"), unless the configuration maps it to a
name (`owners = {"telegram:123" = "alice"}`; mapping a thread to "local" makes
it the local user's).  Recall searches the full-text index over the threads of
the asking thread's owner only, plus the threads of owners configured as shared
(`shared_owners`); the scope is enforced by the index query and checked again
on every hit.

Recalled messages come back as `Entry` objects of kind "recalled", retention
DROPPABLE (compression may drop them first), turn 0, their text prefixed by where,
when and by whom they were said: `[recalled from telegram:-1001, 2026-11-02, user
4711 Ann] the staging database is on port 5433`.

Ranking: each owner's messages are scored with that owner's own word
statistics (see `opencortex.memory.partitions`).  A date expression in the
question ("last week", "in March", "2026-03-14") searches that period first;
"now" / "currently" put newer matches ahead (a fact that changed), and "now"
ranks the matches that say it too ("I'm working as a nurse now").  A word
that names a sender in scope ("What did Caroline give?") also searches what
that person said for the other words, and those hits lead (two for each
other): in a chat a name in the text mostly greets the person addressed ("Bye
Caroline!"), and the one asked about is the one who said it, so a message that
matches the name alone is not recalled; with a period named
and none of the other words said by them then, what they said in it leads.  Of
the other matches, one naming them (or sent by them) counts a bounded bonus more:
a name in most messages weighs ~nothing in BM25 (see `recallorder`).  A text repeated
word for word (small talk) is recalled once.  A hit that is a question brings
the reply after it, and a reply the question before it ("next to a recalled
message"), after the K best.  `explain` says what was recalled and why, for
/recall.

Dense recall (optional, see `dense`): with an embedding model configured, the
same scope is also ranked by the model, and the two rankings are fused by
reciprocal rank (see `fusion`); a hit's score is then the fused score.
Without one, recall is lexical and nothing of it is loaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from opencortex.conversation.branches import unique
from opencortex.conversation.delivery import as_seen
from opencortex.conversation.entries import Entry
from opencortex.conversation.fusion import Ranked, fuse
from opencortex.conversation.recalldates import DateHint, date_hint
from opencortex.conversation.recallorder import (mix_named, newer_first, reranked, said_first,
                                                  sent_by)
from opencortex.conversation.recallwords import (QUESTION_MARKS, asks, is_question,
                                                  partner_of, present_words,
                                                  searched_words, without_names)
from opencortex.conversation.recallexplain import explain
from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, SearchHit
from opencortex.memory.partitions import LOCAL_PARTITION, default_partition
from opencortex.memory.query import query_text, query_words
from opencortex.memory.rows import shown_who, text_key

if TYPE_CHECKING:
    from opencortex.conversation.dense import DenseRecall

log = logging.getLogger(__name__)

LOCAL_OWNER = LOCAL_PARTITION
MAX_RECALLED_CHARS = 2000      # a longer recalled message is cut (with "…")
SETTLE_NS = 2_000_000_000      # directory times this recent may hide a change (coarse clocks)
RECHECK_NS = 100_000_000       # while they are that recent, read the thread list this often;
                               # and the directories are looked at (for other processes'
                               # new threads) at most this often
CANDIDATES = 4                 # recall ranks this many times K matches before keeping K
SAID_READ = 8                  # a period's messages read per one kept of a named person's

def owner_of(thread: Thread, owners: Mapping[str, str]) -> str:
    """Who is talking in THREAD: the configured name for "channel:chat-id" (or for its
    chat, when THREAD is a topic of one: see `Thread.chat`) if any; else "local" for
    Emacs and terminal threads; else the chat itself ("telegram:123")."""
    thread = Thread(*thread)
    configured = next((owners[name] for name in thread.config_names if owners.get(name)), "")
    return configured or default_partition(thread)


class Recall:
    """Top-k earlier messages for a thread, from the threads of the same owner only."""

    def __init__(self, archive: Archive, owners: Mapping[str, str],
                 shared_owners: Sequence[str] = (), *,
                 max_chars: int = MAX_RECALLED_CHARS, dense: DenseRecall | None = None):
        """OWNERS maps "channel:chat-id" to an owner name; SHARED_OWNERS are owners
        whose threads every owner may recall from (default: none).  DENSE: the
        optional embedding ranking fused with the lexical one (may be set later)."""
        if isinstance(shared_owners, str):
            raise TypeError("shared_owners must be a list of owner names, not one string")
        self.archive = archive
        self.owners = dict(owners)
        self.shared_owners = tuple(shared_owners)
        self.max_chars = max_chars
        self.dense = dense
        self._by_owner: dict[str, list[Thread]] = {}
        self._known: set[Thread] = set()
        self._stamp: tuple[tuple[str, int], ...] | None = None
        self._unsettled = False     # the stamp was too young to trust when last read
        self._read_at = 0           # time.monotonic_ns() of the last read
        self._looked = (-1, 0)      # archive.files_made and monotonic_ns at the last look
        archive.set_partition(self.owner)          # rank with each owner's own statistics

    # -- scope ---------------------------------------------------------------

    def owner(self, thread: Thread) -> str:
        """The owner of THREAD under this recall's configuration."""
        return owner_of(thread, self.owners)

    def threads_of(self, owner: str) -> list[Thread]:
        """Every archived thread of OWNER, sorted (refreshed when a new thread appears)."""
        self._refresh()
        return list(self._by_owner.get(owner, ()))

    def scope(self, thread: Thread) -> list[Thread]:
        """The threads recall may search for THREAD: its owner's, plus shared owners'."""
        thread = Thread(*thread)
        self._refresh()
        if thread not in self._known and self.archive.thread_file(thread).exists():
            self._refresh(force=True)        # a thread written since the last look
        found = {thread}
        for owner in {self.owner(thread), *self.shared_owners}:
            found.update(self._by_owner.get(owner, ()))
        return sorted(found)

    def _refresh(self, *, force: bool = False) -> None:
        """Re-read the archive's thread list when a channel directory changed.

        A stamp younger than SETTLE_NS cannot be trusted (a file made in the same
        clock tick would not change it): until it settles the list is read again,
        but at most every RECHECK_NS, so a new chat does not make every turn of a
        large archive read every thread file's header.  The directories themselves
        are looked at when this archive made a thread file since, else at most every
        RECHECK_NS (another process's new thread is noticed that late)."""
        now = time.monotonic_ns()
        made = self.archive.files_made
        if not force and self._stamp is not None and made == self._looked[0] and \
                now - self._looked[1] < RECHECK_NS:
            return
        stamp = self._directory_stamp()
        self._looked = (made, now)
        if not force and stamp == self._stamp and (
                not self._unsettled or now - self._read_at < RECHECK_NS):
            return
        by_owner: dict[str, list[Thread]] = {}
        threads = self.archive.threads()
        for thread in threads:
            by_owner.setdefault(self.owner(thread), []).append(thread)
        self._unsettled = max(mtime for _, mtime in stamp) > time.time_ns() - SETTLE_NS
        self._by_owner, self._known, self._stamp = by_owner, set(threads), stamp
        self._read_at = now
        log.debug("recall: %d thread(s) of %d owner(s)", len(threads), len(by_owner))

    def _directory_stamp(self) -> tuple[tuple[str, int], ...]:
        """Modification times of the archive root and its channel directories.

        Creating a thread file changes its directory's time, so a new thread
        is noticed without reading every file header again.  File times come
        from a coarse clock: a stamp younger than SETTLE_NS is not trusted."""
        root = self.archive.root
        stamp = [("", os.stat(root).st_mtime_ns)]
        with os.scandir(root) as listing:
            for item in listing:
                if item.is_dir(follow_symlinks=False):
                    stamp.append((item.name, item.stat(follow_symlinks=False).st_mtime_ns))
        return tuple(sorted(stamp))

    # -- recall --------------------------------------------------------------

    def recall(self, thread: Thread, query: str, *, k: int = 5,
               exclude_ids: Collection[str] = ()) -> list[Entry]:
        """The K messages best matching QUERY from THREAD's owner (and shared owners),
        best first, then the question or reply next to each (see the module notes).

        EXCLUDE_IDS: messages already in the context.
        """
        hits, _ = self.hits(thread, query, k=k, exclude_ids=exclude_ids)
        beside = self.beside(hits, exclude_ids)
        log.debug("recall: %d recalled, %d beside them", len(hits), len(beside))
        gone = self.archive.undelivered([h.id for h in hits] + [p.id for _, p, _ in beside])
        return [self.entry(hit, gone=gone) for hit in hits] + \
            [self.entry(partner, near=True, gone=gone) for _, partner, _ in beside]

    def beside(self, hits: Sequence[SearchHit], exclude_ids: Collection[str] = ()
               ) -> list[tuple[SearchHit, MessageRecord, bool]]:
        """(hit, message, whether it is the reply) for each of HITS that brings the question
        or reply next to it (see `partner_of`), each message once, none of HITS or
        EXCLUDE_IDS."""
        known = {hit.id for hit in hits}
        near = self.archive.neighbours_of(      # the reply after questions; a question before
            [hit.id for hit in hits], after_of=[hit.id for hit in hits if asks(hit.text)],
            before_with=QUESTION_MARKS) if hits else {}
        found = []
        for hit in hits:
            before, after = near.get(hit.id, (None, None))
            partner = partner_of(hit, before, after)
            if partner is not None and partner.id not in known and \
                    partner.id not in exclude_ids:
                known.add(partner.id)
                found.append((hit, partner, partner is after))
        return found

    def hits(self, thread: Thread, query: str, *, k: int = 5,
             exclude_ids: Collection[str] = (), informative_only: bool = True
             ) -> tuple[list[SearchHit], DateHint]:
        """The K best hits for QUERY in THREAD's scope, and what the question said about
        time.  INFORMATIVE_ONLY (recall's own): none when every word is very common in
        the owner's messages; else the newest matches then (a search asked for)."""
        ranked, hint = self.ranked(thread, query, k=k, exclude_ids=exclude_ids,
                                   informative_only=informative_only)
        return [r.hit if r.fused is None else r.hit.model_copy(update={"score": r.fused})
                for r in ranked], hint

    def ranked(self, thread: Thread, query: str, *, k: int = 5,
               exclude_ids: Collection[str] = (), snippets: bool = False,
               informative_only: bool = True) -> tuple[list[Ranked], DateHint]:
        """The K best hits with the ranks that put them there (lexical, dense, fused);
        with SNIPPETS, each lexical hit's matched words marked (for `explain`);
        INFORMATIVE_ONLY as in `hits` (a period named in QUERY is searched either way).
        Of a long QUERY, its start and its end are read (see `query_text`)."""
        query = query_text(query)
        hint = date_hint(query, time.time())
        if k <= 0 or not query.strip():
            return [], hint
        thread = Thread(*thread)
        allowed, where = self._scope_of(thread)
        words = searched_words(query, hint.text)
        if not words:           # only function words: nothing to match, but a period named
            said = [] if hint.window is None else self.archive.said_within(
                hint.window, limit=k, exclude_ids=exclude_ids, **where)
            return [Ranked(hit, rank, None, None) for rank, hit in enumerate(said, 1)], hint
        named, rest = self._named(words, where)
        present = present_words(hint.text)
        asking = is_question(query)
        search = partial(self.archive.search, exclude_ids=exclude_ids, snippets=snippets,
                         distinct=True, **where)

        def tiers(limit: int, wider: int = 0, recent: bool = False, **options
                  ) -> tuple[list[SearchHit], list[SearchHit]]:
            """What the people named said (LIMIT), and every match (WIDER when someone
            is named: see `reranked`), both ranked by OPTIONS, newer first if RECENT.
            Asked about, what a named person said is worth recalling even when every
            word is very common: then their newest matches (see `RankedSearch.search`);
            a remark ("thanks Bob") recalls nothing then, as any other.  A match of
            the names alone is none: it mostly greets them ("Bye Caroline!"); nor is
            one of the PRESENT words alone ("now"): they only rank."""
            said_options = {**options, "informative_only": False} if asking else options
            said = search(f"{rest} {present}", senders=named, required=rest if present
                          else "", limit=limit, **said_options) if named else []
            needed = rest if named or present else ""
            general = search(f"{words} {present}", required=needed,
                             limit=max(limit, wider) if named else limit, **options)
            return (newer_first(said) if recent else said,
                    reranked(general, named, recent=recent))
        if hint.window is None and not hint.recent and self.dense is None:
            # Then the K best are the first K of the candidates, and only those are read
            # (all of them when someone is named: they are re-ranked), unless copies or
            # hits outside the scope leave fewer than K of them.
            said, general = tiers(k, wider=CANDIDATES * k, candidates=CANDIDATES * k,
                                  informative_only=informative_only)
            kept = self._kept(thread, allowed, mix_named(said, general), hint, query, exclude_ids,
                              named)
            if len(kept) >= k or (len(said) < k and len(general) < k):
                return kept[:k], hint
        found: list[SearchHit] = []
        if hint.window is not None:       # a period named is searched either way; when
            said, general = tiers(2 * k, window=hint.window)
            if not said:                  # none of the other words: what they said then
                said = self._said_by(named or self.archive.speakers(words, **where),
                                     hint.window, 2 * k, exclude_ids, where)
            found += mix_named(said, general) or \
                self.archive.said_within(hint.window, limit=k, exclude_ids=exclude_ids,
                                         **where)   # no word matches: what was said then
        said, general = tiers(CANDIDATES * k, recent=hint.recent,
                              informative_only=informative_only)
        found += mix_named(said, general)
        return self._kept(thread, allowed, found, hint, query, exclude_ids, named)[:k], hint

    def _scope_of(self, thread: Thread) -> tuple[set[str], dict]:
        """The owners THREAD may recall from (its own, the shared ones), and its search
        scope: by those owners while the index's tables are these owners' (see
        `partitions`), else by their threads."""
        allowed = {self.owner(thread), *self.shared_owners}
        if self.archive.partition == self.owner:
            return allowed, {"owners": allowed}
        return allowed, {"threads": self.scope(thread)}

    def _named(self, words: str, where: dict) -> tuple[list[str], str]:
        """The words of WORDS that name a sender in scope (WHERE), and the other words:
        "Where does Caroline work" asks what Caroline said about work, above all.  No
        one is named when no other word is left."""
        named = self.archive.speakers(words, **where)
        rest = [word for word in query_words(words) if word not in named]
        return (named, " ".join(rest)) if named and rest else ([], words)

    def _said_by(self, named: list[str], window: tuple[float, float], limit: int,
                 exclude_ids: Collection[str], where: dict) -> list[SearchHit]:
        """The newest LIMIT messages the people NAMED (words of the question) sent within
        WINDOW: "What did Nadia do on 8 May?" asks for hers, not the ones greeting her."""
        if not named:
            return []
        said = self.archive.said_within(window, limit=SAID_READ * limit,
                                        exclude_ids=exclude_ids, **where)
        return sent_by(said, named)[:limit]

    def _kept(self, thread: Thread, allowed: set[str], found: list[SearchHit],
              hint: DateHint, query: str, exclude_ids: Collection[str],
              named: Sequence[str] = ()) -> list[Ranked]:
        """FOUND (the lexical hits, best first) each message once, fused with the dense
        ranking if any (NAMED: the words of the question naming senders, see `_dense`),
        and checked to be of an ALLOWED owner (THREAD's or a shared one); a text
        repeated word for word only where it first comes (each search returns a text
        once; this holds across the lists merged and the dense ranking too)."""
        lexical = unique(found, seen=exclude_ids)        # a merged copy is the same message
        dense = self._dense(thread, hint.text if hint.text.strip() else query, exclude_ids, hint,
                            named)
        if dense is None:
            ranked = [Ranked(hit, rank, None, None) for rank, hit in enumerate(lexical, 1)]
        else:
            settings = self.dense.settings
            ranked = fuse(lexical, dense, k=settings.k, weight=settings.weight)
            once = {hit.id for hit in unique([r.hit for r in ranked], seen=exclude_ids)}
            ranked = [r for r in ranked if r.hit.id in once]
        kept = []
        owners: dict[Thread, str] = {}        # each hit's thread's owner, found once
        texts: set[str] = set()
        for item in ranked:
            where = item.hit.thread
            if where not in owners:
                owners[where] = self.owner(where)
            if owners[where] not in allowed:
                log.error("recall: dropped a hit outside the owner's scope")   # never expected
                continue
            text = text_key(item.hit.text)
            if text not in texts:
                texts.add(text)
                kept.append(item)
        return kept

    def _dense(self, thread: Thread, text: str, exclude_ids: Collection[str],
               hint: DateHint, named: Sequence[str] = ()) -> list[SearchHit] | None:
        """The dense ranking of THREAD's scope for TEXT, or None (no model, or it failed).

        A name weighs more in a sentence embedding than the words around it, and in a
        chat most messages name the person they are said to, so "Which pet did Aiko
        adopt?" would find what was said to Aiko.  The question is embedded without
        the NAMED senders' names, and what they said leads, as in the lexical tiers
        (see `mix_named`)."""
        if self.dense is None:
            return None
        found = self.dense.rank(self.scope(thread), without_names(text, named),
                                exclude_ids=exclude_ids, window=hint.window)
        if found is None:
            return None
        found = said_first(found, named)
        return newer_first(found) if hint.recent else found

    def explain(self, thread: Thread, query: str, *, k: int = 10) -> str:
        """What recall brings for QUERY and why, for /recall (see `recallexplain`)."""
        return explain(self, thread, query, k=k)

    def named(self, thread: Thread, words: str) -> list[str]:
        """The words of WORDS (a recall query) that name a sender in THREAD's scope."""
        return self._named(words, self._scope_of(Thread(*thread))[1])[0]

    def entry(self, hit: MessageRecord, *, near: bool = False,
              gone: Collection[str] = ()) -> Entry:
        """HIT as a recalled entry: where, when and by whom it was said, then its text
        (NEAR: it came as the question or reply next to a recalled message), marked when
        it is in GONE (the person never got it, see `delivery`)."""
        when = datetime.fromtimestamp(hit.timestamp).strftime("%Y-%m-%d")
        text = as_seen(hit.text, hit.id in gone)
        if len(text) > self.max_chars:
            text = text[:self.max_chars].rstrip() + " …"
        by = " ".join([hit.role, shown_who(hit.sender, hit.extra)]).strip()
        beside = ", next to a recalled message" if near else ""
        return Entry(id=hit.id, role=hit.role, text=f"[recalled from {hit.thread}, {when}, "
                     f"{by}{beside}] {text}", turn=0, turn_type=hit.turn_type,
                     retention="DROPPABLE", kind="recalled")


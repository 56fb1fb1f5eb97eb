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
DROPPABLE (compression may drop them first), turn 0, with their text prefixed
by where and when they were said, so the user can see what was recalled::

    [recalled from cli:local, 2026-11-02, user] the staging database is on port 5433
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from opencortex.conversation.branches import unique
from opencortex.conversation.entries import Entry
from opencortex.events import Thread
from opencortex.memory import Archive, SearchHit

log = logging.getLogger(__name__)

LOCAL_OWNER = "local"
LOCAL_CHANNELS = frozenset({"emacs", "cli"})
MAX_RECALLED_CHARS = 2000      # a longer recalled message is cut (with "…")
SETTLE_NS = 2_000_000_000      # directory times this recent may hide a change (coarse clocks)

# Function words left out of a recall query while other words remain: they match
# almost every message and would recall noise.
_STOPWORDS = frozenset("""
a about above after again all also am an and any are as at be because been before being
below between both but by can could did do does doing done down during each few for from
further had has have having he her here hers him his how i if in into is it its itself just
let like me more most my no nor not now of off on once only or other our ours out over own
please same she should so some such than that the their theirs them then there these they
this those through to too under until up very was we were what when where which while who
whom why will with would you your yours
""".split())
_WORD_EDGES = re.compile(r"^\W+|\W+$")


def owner_of(thread: Thread, owners: Mapping[str, str]) -> str:
    """Who is talking in THREAD: the configured name for "channel:chat-id" if any;
    else "local" for Emacs and terminal threads; else the thread itself ("telegram:123").
    """
    thread = Thread(*thread)
    configured = owners.get(str(thread))
    if configured:
        return configured
    if thread.channel in LOCAL_CHANNELS:
        return LOCAL_OWNER
    return str(thread)


def recall_query(text: str) -> str:
    """The words of TEXT worth searching for: without function words, unless that is all."""
    words = text.split()
    kept = [w for w in words if _WORD_EDGES.sub("", w).casefold() not in _STOPWORDS]
    return " ".join(kept or words)


class Recall:
    """Top-k earlier messages for a thread, from the threads of the same owner only."""

    def __init__(self, archive: Archive, owners: Mapping[str, str],
                 shared_owners: Sequence[str] = (), *,
                 max_chars: int = MAX_RECALLED_CHARS):
        """OWNERS maps "channel:chat-id" to an owner name; SHARED_OWNERS are owners
        whose threads every owner may recall from (default: none)."""
        if isinstance(shared_owners, str):
            raise TypeError("shared_owners must be a list of owner names, not one string")
        self.archive = archive
        self.owners = dict(owners)
        self.shared_owners = tuple(shared_owners)
        self.max_chars = max_chars
        self._by_owner: dict[str, list[Thread]] = {}
        self._known: set[Thread] = set()
        self._stamp: tuple[tuple[str, int], ...] | None = None

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
        """Re-read the archive's thread list when a channel directory changed."""
        stamp = self._directory_stamp()
        if not force and stamp == self._stamp:
            return
        by_owner: dict[str, list[Thread]] = {}
        threads = self.archive.threads()
        for thread in threads:
            by_owner.setdefault(self.owner(thread), []).append(thread)
        if max(mtime for _, mtime in stamp) > time.time_ns() - SETTLE_NS:
            stamp = None      # a file made in the same clock tick would not change the time
        self._by_owner, self._known, self._stamp = by_owner, set(threads), stamp
        log.debug("recall: %d thread(s) of %d owner(s)", len(threads), len(by_owner))

    def _directory_stamp(self) -> tuple[tuple[str, int], ...]:
        """Modification times of the archive root and its channel directories.

        Creating a thread file changes its directory's time, so a new thread
        is noticed without reading every file header again.  File times come
        from a coarse clock: a stamp younger than SETTLE_NS is not trusted.
        """
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
        """The K messages best matching QUERY from THREAD's owner (and shared owners).

        EXCLUDE_IDS: messages already in the context.  Best match first.
        """
        if k <= 0 or not query.strip():
            return []
        thread = Thread(*thread)
        scope = self.scope(thread)
        allowed = {self.owner(thread), *self.shared_owners}
        hits = self.archive.search(recall_query(query), threads=scope, limit=2 * k,
                                   exclude_ids=exclude_ids)
        entries = []
        for hit in unique(hits, seen=exclude_ids)[:k]:   # a merged copy is the same message
            if hit.thread != thread and self.owner(hit.thread) not in allowed:
                log.error("recall: dropped a hit outside the owner's scope")   # never expected
                continue
            entries.append(self.entry(hit))
        log.debug("recall: %d of %d thread(s) searched, %d recalled", len(scope),
                  len(self._known), len(entries))
        return entries

    def entry(self, hit: SearchHit) -> Entry:
        """HIT as a recalled entry: where and when it was said, then its text."""
        when = datetime.fromtimestamp(hit.timestamp).strftime("%Y-%m-%d")
        text = hit.text
        if len(text) > self.max_chars:
            text = text[:self.max_chars].rstrip() + " …"
        return Entry(id=hit.id, role=hit.role, text=f"[recalled from {hit.thread}, {when}, "
                     f"{hit.role}] {text}", turn=0, turn_type=hit.turn_type,
                     retention="DROPPABLE", kind="recalled")

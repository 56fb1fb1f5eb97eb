"""Named sessions: a name for a thread's branch and head, kept in an org file.

`ROOT/sessions.org` (ROOT is the archive root, `$OPENCORTEX_HOME/memory`) gets
one heading per save; the latest save of a name wins::

    * parser work [2026-11-22 Sun 02:55]
    :PROPERTIES:
    :NAME:     parser work
    :OWNER:    local
    :THREAD:   cli:local
    :BRANCH:   main
    :HEAD:     0b6c…
    :SAVED_AT: 1795312503.123456
    :TITLE:    Reader errors for unbalanced forms
    :END:

Names belong to their owner (see `recall.owner_of`): two owners may both save
"work", and neither sees, finds or loads the other's.  Names are compared
without regard to case.  An owner keeps at most `MAX_PER_OWNER` names: a save
of a new name beyond that lets go the name saved longest ago (the save says
which).  Values, and the name in the heading, are encoded like the archive's
properties (one line each, exact round trip).  A save is one locked, fsynced
append; an entry torn by a crash (no `:END:`) is ignored when reading.  When
superseded entries pile up, the file is rewritten with the live ones
(atomically: see `savedfile`), so it stays bounded however often people save.
"""

from __future__ import annotations

import os
import threading
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from opencortex.conversation.recall import owner_of
from opencortex.conversation.savedfile import (HEADER, MAX_PER_OWNER, SavedIndex,
                                               SavedSession, compact_quietly, parse_saves,
                                               render)
from opencortex.events import Thread
from opencortex.files import write_all
from opencortex.memory import Archive
from opencortex.memory.records import check_epoch, check_thread
from opencortex.memory.threadfile import locked, read_range

FILE_NAME = "sessions.org"
MAX_NAME = 80
MAX_TITLE = 200
MAX_FIELD = 200              # branch names and head ids
__all__ = ["FILE_NAME", "HEADER", "MAX_NAME", "MAX_PER_OWNER", "SavedSession",
           "SavedSessions", "check_name", "parse_saves"]


def check_name(name: str) -> str:
    """NAME without surrounding blanks; ValueError unless one printable line of <= 80 chars."""
    if not isinstance(name, str):
        raise TypeError(f"a session name is text, not {type(name).__name__}")
    name = name.strip()
    if not name:
        raise ValueError("a session name cannot be empty")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") and ch != "\u200d"
           for ch in name):
        raise ValueError("a session name must be one line of printable characters")
    if len(name) > MAX_NAME:
        raise ValueError(f"a session name has at most {MAX_NAME} characters, "
                         f"not {len(name)}")
    return name


def _one_line(value: str, limit: int) -> str:
    """VALUE with runs of blanks and line breaks made single spaces, cut to LIMIT chars."""
    flat = " ".join(value.split())
    return flat if len(flat) <= limit else flat[:limit - 1].rstrip() + "…"


def _field(value: str, what: str) -> str:
    """VALUE, unless it is not one word of at most MAX_FIELD characters (ValueError)."""
    if not isinstance(value, str) or not value or value.split() != [value] \
            or len(value) > MAX_FIELD:
        raise ValueError(f"{what} must be one word of at most {MAX_FIELD} characters, "
                         f"not {value!r}")
    return value


class SavedSessions:
    """Save, load, list and search named sessions (an org file, compacted now and then)."""

    def __init__(self, archive_root: Path, *, owners: Mapping[str, str] | None = None,
                 archive: Archive | None = None, per_owner: int = MAX_PER_OWNER):
        """ARCHIVE_ROOT holds `sessions.org`; OWNERS maps threads to owners (as for
        recall); ARCHIVE, when given, lets `search` look into the saved threads' messages;
        PER_OWNER is how many names an owner keeps."""
        self.path = Path(archive_root) / FILE_NAME
        self.owners = dict(owners or {})
        self.archive = archive
        self.per_owner = per_owner
        self._index = SavedIndex(per_owner)
        self._index_lock = threading.Lock()     # commands run on worker threads

    _render = staticmethod(render)              # one save's org entry

    # -- writing -------------------------------------------------------------

    def save(self, name: str, thread: Thread, branch: str, head: str | None,
             title: str = "", *, owner: str | None = None) -> SavedSession:
        """Save (or re-save) NAME as THREAD at BRANCH / HEAD; returns what was stored.

        OWNER defaults to the thread's owner.
        """
        return self.save_reporting(name, thread, branch, head, title, owner=owner)[0]

    def save_reporting(self, name: str, thread: Thread, branch: str, head: str | None,
                       title: str = "", *, owner: str | None = None
                       ) -> tuple[SavedSession, str | None]:
        """`save`, also returning the name this save let go (the owner had
        `per_owner` names already; the one saved longest ago goes), or None."""
        session = SavedSession(
            name=check_name(name), thread=check_thread(Thread(*thread)),
            branch=_field(branch, "branch"),
            head=None if head is None else _field(head, "head"),
            saved_at=check_epoch(time.time()), title=_one_line(title or "", MAX_TITLE),
            owner=_one_line(owner or owner_of(Thread(*thread), self.owners), MAX_NAME))
        if not session.owner:
            raise ValueError("an owner name cannot be empty")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = render(session).encode("utf-8")
        with locked(self.path, exclusive=True, create=True) as fd, self._index_lock:
            self._index.refresh(fd)
            let_go = self._index.would_let_go(session)
            size = os.fstat(fd).st_size
            if size == 0:
                entry = HEADER.encode("utf-8") + entry
            elif read_range(fd, size - 1, size) != b"\n":
                entry = b"\n" + entry          # after a torn write: start on a fresh line
            write_all(fd, entry)
            os.fsync(fd)
            self._index.refresh(fd)
            if self._index.wants_compaction():
                compact_quietly(self.path, self._index)
        return session, let_go

    # -- reading -------------------------------------------------------------

    def _live(self, owner: str | None) -> list[SavedSession]:
        """The live saves (of OWNER, when given), in the order they were saved; reads
        only what was appended since the last call."""
        try:
            with locked(self.path, exclusive=False) as fd, self._index_lock:
                self._index.refresh(fd)
                return self._index.sessions(owner)
        except FileNotFoundError:
            return []

    def get(self, name: str, *, owner: str | None = None) -> SavedSession | None:
        """The latest save of NAME (by OWNER, when given), or None."""
        folded = check_name(name).casefold()
        found = [s for s in self._live(owner) if s.name.casefold() == folded]
        return max(found, key=lambda s: s.saved_at, default=None)

    def list(self, *, owner: str | None = None) -> list[SavedSession]:
        """The latest save of every name (of OWNER, when given), newest first."""
        return sorted(self._live(owner), key=lambda s: s.saved_at, reverse=True)

    def search(self, text: str, *, owner: str | None = None,
               limit: int = 20) -> list[SavedSession]:
        """Saves whose name or title contains TEXT (any case) first, newest first;
        then, with an archive, saves whose thread has messages matching TEXT (best first)."""
        sessions = self.list(owner=owner)
        needle = " ".join(text.split()).casefold()
        if not needle:
            return sessions[:limit]
        found = [s for s in sessions
                 if needle in s.name.casefold() or needle in s.title.casefold()]
        rest = [s for s in sessions if s not in found]
        if self.archive is not None and rest and len(found) < limit:
            threads = sorted({s.thread for s in rest})
            best: dict[Thread, int] = {}
            for rank, hit in enumerate(self.archive.search(text, threads=threads, limit=100)):
                best.setdefault(hit.thread, rank)
            found += sorted((s for s in rest if s.thread in best),
                            key=lambda s: (best[s.thread], -s.saved_at))
        return found[:limit]

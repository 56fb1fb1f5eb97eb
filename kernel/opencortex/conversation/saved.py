"""Named sessions: a name for a thread's branch and head, kept in an org file.

`ROOT/sessions.org` (ROOT is the archive root, `$OPENCORTEX_HOME/memory`) is
append-only: every save adds one heading; the latest save of a name wins::

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
without regard to case.  Values, and the name in the heading, are encoded
like the archive's properties (one line each, exact round trip).  A save is
one locked, fsynced write; an entry torn by a crash (no `:END:`) is ignored
when reading.
"""

from __future__ import annotations

import os
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from opencortex.conversation.recall import owner_of
from opencortex.events import Thread
from opencortex.memory import Archive, decode_value, encode_value
from opencortex.memory.records import check_epoch, check_thread
from opencortex.memory.threadfile import locked, read_range, write_all

FILE_NAME = "sessions.org"
MAX_NAME = 80
MAX_TITLE = 200
MAX_FIELD = 200              # branch names and head ids
HEADER = "#+TITLE: opencortex saved sessions\n#+STARTUP: overview\n\n"
_KEYS = ("NAME", "OWNER", "THREAD", "BRANCH", "HEAD", "SAVED_AT", "TITLE")
_REQUIRED = ("NAME", "OWNER", "THREAD", "BRANCH", "SAVED_AT")


@dataclass(frozen=True)
class SavedSession:
    """One named save: which thread, which branch and head, when, and a title."""

    name: str
    thread: Thread
    branch: str
    head: str | None            # None: the branch was empty when saved
    saved_at: float             # epoch seconds
    title: str
    owner: str


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
    if not isinstance(value, str) or not value or value.split() != [value] \
            or len(value) > MAX_FIELD:
        raise ValueError(f"{what} must be one word of at most {MAX_FIELD} characters, "
                         f"not {value!r}")
    return value


class SavedSessions:
    """Save, load, list and search named sessions (an append-only org file)."""

    def __init__(self, archive_root: Path, *, owners: Mapping[str, str] | None = None,
                 archive: Archive | None = None):
        """ARCHIVE_ROOT holds `sessions.org`; OWNERS maps threads to owners (as for
        recall); ARCHIVE, when given, lets `search` look into the saved threads' messages."""
        self.path = Path(archive_root) / FILE_NAME
        self.owners = dict(owners or {})
        self.archive = archive
        self._cache: tuple[tuple[int, int, int], list[SavedSession]] | None = None

    # -- writing -------------------------------------------------------------

    def save(self, name: str, thread: Thread, branch: str, head: str | None,
             title: str = "", *, owner: str | None = None) -> SavedSession:
        """Save (or re-save) NAME as THREAD at BRANCH / HEAD; returns what was stored.

        OWNER defaults to the thread's owner.
        """
        session = SavedSession(
            name=check_name(name), thread=check_thread(Thread(*thread)),
            branch=_field(branch, "branch"),
            head=None if head is None else _field(head, "head"),
            saved_at=check_epoch(time.time()), title=_one_line(title or "", MAX_TITLE),
            owner=_one_line(owner or owner_of(Thread(*thread), self.owners), MAX_NAME))
        if not session.owner:
            raise ValueError("an owner name cannot be empty")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = self._render(session).encode("utf-8")
        with locked(self.path, exclusive=True, create=True) as fd:
            size = os.fstat(fd).st_size
            if size == 0:
                entry = HEADER.encode("utf-8") + entry
            elif read_range(fd, size - 1, size) != b"\n":
                entry = b"\n" + entry          # after a torn write: start on a fresh line
            write_all(fd, entry)
            os.fsync(fd)
        return session

    @staticmethod
    def _render(session: SavedSession) -> str:
        when = datetime.fromtimestamp(session.saved_at).strftime("%Y-%m-%d %a %H:%M")
        values = {"NAME": session.name, "OWNER": session.owner,
                  "THREAD": str(session.thread), "BRANCH": session.branch,
                  "HEAD": session.head or "", "SAVED_AT": repr(session.saved_at),
                  "TITLE": session.title}
        lines = [f"* {encode_value(session.name)} [{when}]", ":PROPERTIES:"]
        lines += [f"{':' + key + ':':<10} {encode_value(values[key])}".rstrip(" ")
                  for key in _KEYS]
        lines.append(":END:")
        return "\n".join(lines) + "\n"

    # -- reading -------------------------------------------------------------

    def _all(self) -> list[SavedSession]:
        """Every complete save, in file order (re-read only when the file changed)."""
        try:
            with locked(self.path, exclusive=False) as fd:
                info = os.fstat(fd)
                key = (info.st_ino, info.st_size, info.st_mtime_ns)
                if self._cache is not None and self._cache[0] == key:
                    return self._cache[1]
                data = read_range(fd, 0, info.st_size)
        except FileNotFoundError:
            return []
        saves = parse_saves(data.decode("utf-8", "replace"))
        self._cache = (key, saves)
        return saves

    def _latest(self, owner: str | None) -> dict[tuple[str, str], SavedSession]:
        latest: dict[tuple[str, str], SavedSession] = {}
        for session in self._all():
            if owner is None or session.owner == owner:
                latest[(session.owner, session.name.casefold())] = session
        return latest

    def get(self, name: str, *, owner: str | None = None) -> SavedSession | None:
        """The latest save of NAME (by OWNER, when given), or None."""
        folded = check_name(name).casefold()
        found = [s for (_, key), s in self._latest(owner).items() if key == folded]
        return max(found, key=lambda s: s.saved_at, default=None)

    def list(self, *, owner: str | None = None) -> list[SavedSession]:
        """The latest save of every name (of OWNER, when given), newest first."""
        return sorted(self._latest(owner).values(), key=lambda s: s.saved_at, reverse=True)

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


def parse_saves(text: str) -> list[SavedSession]:
    """The complete save entries of a sessions.org text, in order (torn or bad ones skipped)."""
    saves: list[SavedSession] = []
    props: dict[str, str] | None = None       # the entry being read, None between entries
    for line in text.split("\n"):
        if line.startswith("* "):
            props = {}
        elif props is None:
            continue
        elif line == ":END:":
            session = _session(props)
            if session is not None:
                saves.append(session)
            props = None
        elif line.startswith(":") and line != ":PROPERTIES:":
            key, _, value = line[1:].partition(":")
            try:
                props[key] = decode_value(value.strip(" "))
            except ValueError:                # not something `save` wrote: skip the entry
                props = None
    return saves


def _session(props: dict[str, str]) -> SavedSession | None:
    if any(not props.get(key) for key in _REQUIRED):
        return None
    try:
        channel, _, chat_id = props["THREAD"].partition(":")
        return SavedSession(name=props["NAME"], thread=check_thread(Thread(channel, chat_id)),
                            branch=props["BRANCH"], head=props.get("HEAD") or None,
                            saved_at=float(props["SAVED_AT"]), title=props.get("TITLE", ""),
                            owner=props["OWNER"])
    except ValueError:
        return None

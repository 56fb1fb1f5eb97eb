"""The saved-sessions file: its org entries, an index of the live ones, and compaction.

`sessions.org` is appended to by every save.  `SavedIndex` holds only the
live saves (the latest of each owner's name, at most `MAX_PER_OWNER` names
per owner: the names saved longest ago are let go) and catches up by parsing
only the bytes appended since it last read, so a /sessions after someone
else's save costs that save, not the whole file (a file replaced, shrunk, or
changed without growing is read again whole).  When the file holds more
superseded entries than `max(COMPACT_MIN, live entries)`, `compact` rewrites
it with the live entries only: write a temporary file, fsync it, rename it
over the old one, fsync the directory.  A crash before the rename leaves the
old file (every save in it); after the rename, the new one (every live save).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from opencortex.events import Thread
from opencortex.files import replace_file
from opencortex.memory import decode_value, encode_value
from opencortex.memory.records import check_thread
from opencortex.memory.threadfile import read_range

log = logging.getLogger(__name__)

HEADER = "#+TITLE: opencortex saved sessions\n#+STARTUP: overview\n\n"
MAX_PER_OWNER = 100          # saved names kept per owner; older ones are let go
COMPACT_MIN = 256            # superseded entries tolerated before compacting, at least
TAIL_CHECK = 32              # bytes compared to notice a file rewritten in place
READ_CHUNK = 1 << 20         # bytes parsed at a time (an old, long file is read in pieces)
_END = b"\n:END:\n"
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


def render(session: SavedSession) -> str:
    """The org entry (heading and property drawer) of SESSION."""
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
    """The save a property drawer describes, or None when it lacks or garbles a field."""
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


def complete_length(data: bytes) -> int:
    """How many leading bytes of DATA (read from a line start) end with a complete entry."""
    found = (b"\n" + data).rfind(_END)
    return 0 if found < 0 else found + len(_END) - 1


class SavedIndex:
    """The live saves of one sessions.org, by owner and folded name, newest save last."""

    def __init__(self, per_owner: int = MAX_PER_OWNER):
        """PER_OWNER: how many names an owner keeps."""
        self.per_owner = per_owner
        self.reset(None)

    def reset(self, file: tuple[int, int] | None) -> None:
        """Forget everything: FILE (device, inode) is to be read from its start."""
        self.by_owner: dict[str, dict[str, tuple[int, SavedSession]]] = {}
        self.entries = 0            # complete entries read from the file
        self.sequence = 0           # order of the saves read, across owners
        self.file = file
        self.offset = 0             # bytes read: up to the end of the last complete entry
        self.tail = b""             # the TAIL_CHECK bytes before `offset`
        self.mtime = 0              # the file's mtime when last read

    def live(self) -> int:
        """How many saves are live (the rest of the file's entries are superseded)."""
        return sum(len(names) for names in self.by_owner.values())

    def wants_compaction(self) -> bool:
        """Whether the file holds enough superseded entries to be rewritten."""
        live = self.live()
        return self.entries - live > max(COMPACT_MIN, live)

    def add(self, session: SavedSession) -> str | None:
        """Count SESSION as its owner's latest save of its name; the name let go, if any."""
        names = self.by_owner.setdefault(session.owner, {})
        folded = session.name.casefold()
        names.pop(folded, None)
        self.sequence += 1
        names[folded] = (self.sequence, session)
        if len(names) > self.per_owner:
            oldest = next(iter(names))
            return names.pop(oldest)[1].name
        return None

    def would_let_go(self, session: SavedSession) -> str | None:
        """The name saving SESSION would let go (its owner has too many), or None."""
        names = self.by_owner.get(session.owner, {})
        if session.name.casefold() in names or len(names) < self.per_owner:
            return None
        return next(iter(names.values()))[1].name

    def refresh(self, fd: int) -> None:
        """Catch up with the open file FD: read only what was appended since last time
        (everything when it is another file, shrank, or was rewritten in place)."""
        info = os.fstat(fd)
        file = (info.st_dev, info.st_ino)
        if (file != self.file or info.st_size < self.offset
                or (info.st_size == self.offset and info.st_mtime_ns != self.mtime)
                or read_range(fd, self.offset - len(self.tail), self.offset) != self.tail):
            self.reset(file)
        self.mtime = info.st_mtime_ns
        chunk = READ_CHUNK
        while self.offset < info.st_size:
            end = min(info.st_size, self.offset + chunk)
            data = read_range(fd, self.offset, end)
            length = complete_length(data)
            if not length:              # no complete entry in this chunk
                if end >= info.st_size:
                    break               # a torn or unfinished last entry: read it later
                chunk *= 2
                continue
            for session in parse_saves(data[:length].decode("utf-8", "replace")):
                self.entries += 1
                self.add(session)
            self.offset += length
        self.tail = read_range(fd, max(0, self.offset - TAIL_CHECK), self.offset)

    def sessions(self, owner: str | None = None) -> list[SavedSession]:
        """The live saves (of OWNER, when given), in the order they were saved."""
        owners = [owner] if owner is not None else list(self.by_owner)
        found = [pair for name in owners for pair in self.by_owner.get(name, {}).values()]
        return [session for _, session in sorted(found, key=lambda pair: pair[0])]


def compact(path: Path, index: SavedIndex) -> None:
    """Rewrite PATH with INDEX's live saves only (INDEX is up to date; the caller holds
    the file's exclusive lock), then point INDEX at the new file."""
    data = (HEADER + "".join(render(s) for s in index.sessions())).encode("utf-8")
    replace_file(path, data, temporary=path.with_name(path.name + ".new"))
    info = os.stat(path)
    index.entries, index.file = index.live(), (info.st_dev, info.st_ino)
    index.mtime = info.st_mtime_ns
    index.offset, index.tail = len(data), data[-TAIL_CHECK:]


def compact_quietly(path: Path, index: SavedIndex) -> bool:
    """`compact`, logging a failure instead of raising (the saves are safe in the old
    file, and the next save tries again); whether it compacted."""
    try:
        compact(path, index)
        return True
    except OSError as error:
        log.error("saved sessions: compaction failed (%s); the file stays as it was",
                  type(error).__name__)
        return False

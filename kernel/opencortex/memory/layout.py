"""Where the archive keeps each thread: one org file per thread, ROOT/CHANNEL/NAME.org.

NAME is the chat id percent-encoded (reversible), shortened with a hash when
very long; the real chat id is always in the file's `#+CHAT_ID:` header, which
is what lists the archive's threads.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from opencortex.events import Thread
from opencortex.memory.orgformat import read_header_chat_id
from opencortex.memory.records import check_thread

log = logging.getLogger(__name__)

MAX_NAME = 180               # bytes of a file name before it is shortened with a hash
HEADER_BYTES = 1 << 16       # bytes read to find a file's #+CHAT_ID: header


def safe_name(chat_id: str) -> str:
    """A file-system-safe file stem for CHAT_ID (percent-encoded; hashed when long)."""
    name = quote(chat_id, safe="-_.")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(chat_id.encode("utf-8")).hexdigest()[:16]
        name = f"{name[:MAX_NAME - 17]}~{digest}"
    return name


def thread_path(root: Path, thread: Thread) -> Path:
    """The org file under ROOT holding THREAD's messages (ValueError for a bad thread)."""
    channel, chat_id = check_thread(thread)
    return root / channel / f"{safe_name(chat_id)}.org"


class ThreadFiles:
    """The thread files under ROOT, each path worked out once (a write asks twice)."""

    def __init__(self, root: Path, limit: int = 4096):
        self.root = root
        self.limit = limit                      # paths remembered at most
        self._paths: dict[Thread, Path] = {}

    def path(self, thread: Thread) -> Path:
        """`thread_path` of THREAD (ValueError for a bad thread, every time)."""
        found = self._paths.get(thread) if type(thread) is Thread else None
        if found is None:
            found = thread_path(self.root, thread)
            if len(self._paths) >= self.limit:
                self._paths.clear()
            self._paths[check_thread(thread)] = found
        return found

    def name(self, path: Path) -> str:
        """PATH relative to the root, as the index records it."""
        return path.relative_to(self.root).as_posix()


def org_files(root: Path) -> list[Path]:
    """Every thread file under ROOT, sorted (see `org_file_stats`)."""
    return sorted(root / name for name in org_file_stats(root))


def org_file_stats(root: Path) -> dict[str, tuple[int, int]]:
    """The size and modification time (ns) of every thread file under ROOT
    (ROOT/CHANNEL/NAME.org; hidden names are none) by its name relative to ROOT, as
    the index records it: one scan of each channel's directory and a stat per file."""
    stats: dict[str, tuple[int, int]] = {}
    for name, entry in _org_entries(root):
        try:
            stat = entry.stat()
        except FileNotFoundError:       # removed meanwhile
            continue
        stats[name] = (stat.st_size, stat.st_mtime_ns)
    return stats


def _org_entries(root: Path) -> Iterator[tuple[str, os.DirEntry]]:
    """(name relative to ROOT, directory entry) of every thread file under ROOT."""
    if not root.is_dir():                   # a read-only home may have no memory yet
        return
    with os.scandir(root) as channels:
        for channel in channels:
            if channel.name.startswith(".") or not channel.is_dir():
                continue
            try:
                with os.scandir(channel.path) as entries:
                    found = [(f"{channel.name}/{entry.name}", entry) for entry in entries
                             if entry.name.endswith(".org") and not entry.name.startswith(".")
                             and entry.is_file()]
            except PermissionError:
                log.warning("%s cannot be read; its threads are left out", channel.name)
                continue
            yield from found


class ThreadHeaders:
    """The thread of each file under ROOT, as its header names it, read once per file:
    asked again, only files new since (or replaced: another inode) are opened, so
    listing an archive of many chats after each new one costs a directory scan."""

    def __init__(self, root: Path):
        self.root = root
        self._read: dict[str, tuple[int, Thread | None]] = {}   # name -> (inode, thread)

    def threads(self) -> list[Thread]:
        """Every thread with a file under the root, sorted."""
        read: dict[str, tuple[int, Thread | None]] = {}
        for name, inode in _org_inodes(self.root):
            known = self._read.get(name)
            if known is None or known[0] != inode:
                try:
                    known = (inode, self._thread_of(self.root / name))
                except FileNotFoundError:                  # removed meanwhile
                    continue
            read[name] = known
        self._read = read
        return sorted({thread for _, thread in read.values() if thread is not None})

    def _thread_of(self, path: Path) -> Thread | None:
        with path.open("rb") as stream:
            head = stream.read(HEADER_BYTES).split(b"\n*", 1)[0]
        chat_id = read_header_chat_id(head)
        if chat_id is not None:
            return Thread(path.parent.name, chat_id)
        if head:
            log.warning("%s has no #+CHAT_ID: header; skipped",
                        path.relative_to(self.root).as_posix())
        return None


def _org_inodes(root: Path) -> list[tuple[str, int]]:
    """(name relative to ROOT, inode) of every thread file under ROOT (no stat a file)."""
    return [(name, entry.inode()) for name, entry in _org_entries(root)]

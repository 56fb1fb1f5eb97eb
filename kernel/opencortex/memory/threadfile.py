"""A thread's org file on disk: locking, reading the tail, moving a torn tail aside.

Writers hold an exclusive `flock` (file opened read-write with O_APPEND);
readers hold a shared one.  Settling the tail before an append reads the file
backwards (searching for lines starting with `*`) only as far as its last
write reaches, so its cost does not grow with the size of the file.
`entries_backwards` walks the entries from the end the same way, block by
block, for readers that need only the newest part of a thread; `parse_writes`
reads forwards a bounded chunk of whole writes at a time (to catch the index up).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from opencortex.files import write_all
from opencortex.memory.completeness import ParsedFile, complete_end, parse_thread_file

log = logging.getLogger(__name__)

TAIL_CHUNK = 1 << 16         # bytes read at a time when looking for the last entry
_ID_LINE = re.compile(rb"(?m)^:ID:[ \t]*(\S+)[ \t]*$")


class ArchiveError(RuntimeError):
    """Messages could not be saved; the message says why and what to do."""


@contextmanager
def locked(path: Path, *, exclusive: bool, create: bool = False) -> Iterator[int]:
    """Open PATH and hold an flock on it (exclusive: read-write-append; shared: read-only).

    When the file was replaced or removed while waiting for the lock (retention
    rewrites files by renaming a new one over them), the new file is opened instead."""
    if exclusive:
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    else:
        flags = os.O_RDONLY
    for _ in range(REOPEN_ATTEMPTS):
        fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if _same_file(fd, path):
                yield fd
                return
        finally:
            os.close(fd)          # closing the descriptor releases the lock
    raise ArchiveError(f"{path} keeps being replaced; try again")


REOPEN_ATTEMPTS = 10


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open FD is still the file at PATH (not replaced or removed since)."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)


def read_range(fd: int, start: int, end: int) -> bytes:
    """Bytes START..END of the open file (stops early only at end of file)."""
    parts, offset = [], start
    while offset < end:
        piece = os.pread(fd, min(end - offset, 1 << 30), offset)
        if not piece:
            break
        parts.append(piece)
        offset += len(piece)
    return b"".join(parts)


def parse_writes(fd: int, start: int, size: int, limit: int | None) -> ParsedFile:
    """The whole writes of the open file from START (where a write begins) on: those
    within about LIMIT bytes (all up to SIZE without LIMIT), and at least the one
    beginning at START, however long.

    A write longer than LIMIT (an import's: 1,000 messages) is found by reading
    twice as much each time: what is read stays within twice the longer of LIMIT
    and that write, never the rest of the file (unless that write is the rest).
    """
    end = size if limit is None else min(size, start + max(limit, 1))
    while True:
        parsed = parse_thread_file(read_range(fd, start, end), base=start)
        if parsed.length or end >= size:
            return parsed
        end = min(size, start + 2 * (end - start))


def entry_id_at(fd: int, offset: int) -> str | None:
    """The id of the entry beginning at OFFSET of the open file (None: no entry begins
    there, or it has no id), read from its property drawer alone."""
    if offset < 0 or (read_range(fd, offset - 1, offset + 1) if offset else
                      b"\n" + read_range(fd, 0, 1)) != b"\n*":
        return None
    length = 1 << 10
    while True:
        data = read_range(fd, offset, offset + length)
        drawer = data.split(b"\n:END:", 1)[0].split(b"\n*", 1)[0]
        if len(drawer) < len(data) or len(data) < length:
            found = _ID_LINE.search(drawer)
            return found.group(1).decode("utf-8", "replace") if found else None
        length *= 4


def read_last_entry(fd: int, size: int) -> tuple[int | None, bytes]:
    """(start, bytes) of the last entry of the first SIZE bytes; (None, all bytes) if none.

    Reads backwards from the end, so the cost is the size of the last entry.
    """
    pieces: list[bytes] = []      # read so far, last piece of the file first
    end = size
    while end > 0:
        start = max(0, end - TAIL_CHUNK)
        piece = read_range(fd, start, end)
        # A "\n*" may straddle two pieces: look at the first byte of the later one too.
        found = (piece + pieces[-1][:1] if pieces else piece).rfind(b"\n*")
        pieces.append(piece)
        if found >= 0:
            return start + found + 1, b"".join(reversed(pieces))[found + 1:]
        end = start
    data = b"".join(reversed(pieces))
    return (0, data) if data.startswith(b"*") else (None, data)


def entries_backwards(fd: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of each entry in the first END bytes of the file, newest first.

    Reads TAIL_CHUNK bytes at a time from the end, so reading the last N
    entries costs their size, not the file's.  The header before the first
    entry is not an entry and is never yielded.
    """
    buffer, start = b"", end          # buffer holds bytes start .. start + len(buffer)
    stop = 0                          # bytes of the buffer not yielded yet
    while True:
        found = buffer.rfind(b"\n*", 0, stop)
        if found >= 0:
            yield start + found + 1, buffer[found + 1:stop]
            stop = found + 1
            continue
        if start == 0:
            if buffer.startswith(b"*") and stop > 0:
                yield 0, buffer[:stop]
            return
        begin = max(0, start - TAIL_CHUNK)
        buffer = read_range(fd, begin, start) + buffer[:stop]
        stop += start - begin
        start = begin


def move_aside(fd: int, path: Path, start: int, size: int) -> Path:
    """Copy bytes START..SIZE to `<path>.torn-<epoch>`, then cut the file at START."""
    fragment = read_range(fd, start, size)
    stamp = int(time.time())
    for attempt in range(1000):
        target = Path(f"{path}.torn-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            write_new_file(target, fragment)
        except FileExistsError:
            continue
        os.ftruncate(fd, start)
        os.fsync(fd)
        return target
    raise ArchiveError(f"cannot find a free name for the torn tail of {path}; "
                       "remove old .torn- files next to it")


def write_new_file(path: Path, data: bytes) -> None:
    """Write DATA to PATH, a file made anew and private to this user (FileExistsError
    when PATH exists), fsynced before it is closed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def truncate_quietly(fd: int, size: int) -> None:
    """Cut a failed write off again; if even that fails, repair() moves it aside later."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        log.error("could not cut a failed write back to %d bytes", size)


def settle_tail(fd: int, path: Path, name: str) -> tuple[int, str | None, str | None]:
    """Under an exclusive lock, move an incomplete last write aside (the whole write).

    Returns (file size, id of the last complete entry or None, report or None).
    A file left without any complete entry is emptied: its header goes with
    the fragment (a new header is written with the next entry).
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, None, None
    end = complete_end(partial(read_last_entry, fd), size)
    if end.reason is None:
        return size, end.last_id, None
    target = move_aside(fd, path, end.length, size)
    report = (f"{name}: moved {size - end.length} bytes of an incomplete last write "
              f"({end.reason}) to {target.name}")
    log.warning("%s", report)
    return end.length, end.last_id, report


class Tails:
    """The entry each thread file ended with after this process last appended to it, so
    that settling the next append's tail need not read and parse it again.

    Only the bytes are trusted, never times: a file that still ends with that entry
    (and the newline before it), at the size it had, is settled as `settle_tail`
    would settle it, for that complete entry is what it would find last."""

    def __init__(self, limit: int = 1024):
        self._limit = limit                                  # files remembered at most
        self._known: dict[Path, tuple[int, int, bytes, str]] = {}   # size, length, digest, id

    def settle(self, fd: int, path: Path, name: str) -> tuple[int, str | None, str | None]:
        """`settle_tail(FD, PATH, NAME)`, at the cost of reading the last entry alone when
        it is the one this process wrote there."""
        known = self._known.get(path)
        if known is not None:
            size, length, digest, last_id = known
            if os.fstat(fd).st_size == size and \
                    _digest(read_range(fd, size - length, size)) == digest:
                return size, last_id, None
        return settle_tail(fd, path, name)

    def wrote(self, path: Path, size: int, ending: bytes, last_id: str) -> None:
        """PATH now ends, at SIZE, with ENDING: a newline, then its last entry (complete,
        of id LAST_ID)."""
        if len(self._known) >= self._limit and path not in self._known:
            self._known.clear()
        self._known[path] = (size, len(ending), _digest(ending), last_id)

    def last_id(self, path: Path) -> str | None:
        """The id of the entry this process last wrote at the end of PATH, while PATH has
        the size it had then (so the entry is still there); else None."""
        known = self._known.get(path)
        try:
            return known[3] if known and os.stat(path).st_size == known[0] else None
        except OSError:
            return None

    def forget(self, path: Path) -> None:
        """PATH's ending is not known (a write to it failed)."""
        self._known.pop(path, None)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


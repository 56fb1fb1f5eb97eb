"""A thread's org file on disk: locking, reading the tail, moving a torn tail aside.

Writers hold an exclusive `flock` (file opened read-write with O_APPEND);
readers hold a shared one.  Settling the tail before an append reads only the
file's last entry (searching backwards for the last line starting with `*`),
so its cost does not grow with the size of the file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opencortex.memory.orgformat import EntryError, parse_entry

log = logging.getLogger(__name__)

TAIL_CHUNK = 1 << 16         # bytes read at a time when looking for the last entry
_ID_LINE = re.compile(rb"(?m)^:ID:[ \t]*(\S+)[ \t]*$")


class ArchiveError(RuntimeError):
    """Messages could not be saved; the message says why and what to do."""


@contextmanager
def locked(path: Path, *, exclusive: bool, create: bool = False) -> Iterator[int]:
    """Open PATH and hold an flock on it (exclusive: read-write-append; shared: read-only)."""
    if exclusive:
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    else:
        flags = os.O_RDONLY
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)          # closing the descriptor releases the lock


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


def read_last_entry(fd: int, size: int) -> tuple[int | None, bytes]:
    """(start, bytes) of the last entry of the first SIZE bytes; (None, all bytes) if none.

    Reads backwards from the end, so the cost is the size of the last entry.
    """
    end, buffer = size, b""
    while end > 0:
        start = max(0, end - TAIL_CHUNK)
        piece = read_range(fd, start, end)
        buffer = piece + buffer
        found = buffer.rfind(b"\n*", 0, len(piece) + 1)
        if found >= 0:
            return start + found + 1, buffer[found + 1:]
        end = start
    return (0, buffer) if buffer.startswith(b"*") else (None, buffer)


def move_aside(fd: int, path: Path, start: int, size: int) -> Path:
    """Copy bytes START..SIZE to `<path>.torn-<epoch>`, then cut the file at START."""
    fragment = read_range(fd, start, size)
    stamp = int(time.time())
    for attempt in range(1000):
        target = Path(f"{path}.torn-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        try:
            write_all(out, fragment)
            os.fsync(out)
        finally:
            os.close(out)
        os.ftruncate(fd, start)
        os.fsync(fd)
        return target
    raise ArchiveError(f"cannot find a free name for the torn tail of {path}; "
                       "remove old .torn- files next to it")


def write_all(fd: int, data: bytes) -> None:
    """Write all of DATA (os.write may write less than asked, e.g. on a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def truncate_quietly(fd: int, size: int) -> None:
    """Cut a failed write off again; if even that fails, repair() moves it aside later."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        log.error("could not cut a failed write back to %d bytes", size)


def settle_tail(fd: int, path: Path, name: str) -> tuple[int, str | None, str | None]:
    """Under an exclusive lock, move a torn last entry aside.

    Returns (file size, id of the last complete entry or None, report or None).
    A file left without any complete entry is emptied: its header goes with
    the fragment (a new header is written with the next entry).
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, None, None
    start, tail = read_last_entry(fd, size)
    if start is None:
        reason = "the file holds no complete entry"
    else:
        try:
            return size, parse_entry(tail).id, None
        except EntryError as error:
            reason = str(error)
    previous, before = read_last_entry(fd, start) if start else (None, b"")
    cut = start if previous is not None else 0
    target = move_aside(fd, path, cut, size)
    report = f"{name}: moved {size - cut} bytes of a torn last entry ({reason}) to {target.name}"
    log.warning("%s", report)
    match = _ID_LINE.search(before) if previous is not None else None
    return cut, match.group(1).decode("utf-8", "replace") if match else None, report

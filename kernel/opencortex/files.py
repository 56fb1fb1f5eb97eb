"""Writes a crash cannot tear: all of a buffer, a file replaced whole, a directory synced.

The archive's retention, the bridges' inbox, the saved sessions, the skill cache
and serve's connection file each rewrite a file whole.  `replace_file` does it
one way for all: the new content goes to a private temporary file beside the
target, which is renamed over it; durable writes are fsynced before the rename,
and the directory after it (else a crash may bring the old file back).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """Write all of DATA (os.write may write less than asked, e.g. on a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_directory(directory: Path) -> None:
    """fsync DIRECTORY, so a file created or renamed in it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, *, durable: bool = True,
                 temporary: Path | None = None) -> None:
    """Make DATA the content of PATH at once, private to this user (0600).  DURABLE:
    kept by a crash once this returns.  TEMPORARY: the file written first (default: a
    name of this process's beside PATH); one a crash left there is replaced, and it
    is removed when the write fails."""
    temporary = temporary or path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)        # left by a crash: start afresh, private again
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        sync_directory(path.parent)

"""Retention: forget a thread's messages, from its org file and the index together.

`forget(archive, thread, before=None)` removes the thread's messages (all of
them, or those older than BEFORE, an epoch) and returns how many went;
`count_forgettable` says how many would go, changing nothing.

Forgetting everything removes the thread's file.  Forgetting older messages
rewrites the file crash-safely while holding its exclusive lock: the kept
entries are written to `<file>.forget-tmp`, fsynced, renamed over the file,
and the directory is fsynced.  A crash leaves either the old file or the new
one (a leftover temporary file is ignored and replaced next time).  Control
records (branch, head and pin notes) are kept, except the compression summaries
of spans that held a forgotten message: they quote it.  The index then forgets
the file and indexes the kept entries at their new offsets; if the process
dies in between, the index sees a file of another size on its next start and
reads it again, so index and files always end up agreeing.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from opencortex.events import Thread
from opencortex.files import replace_file, sync_directory
from opencortex.memory.archive import Archive
from opencortex.memory.completeness import parse_thread_file
from opencortex.memory.rows import is_control
from opencortex.memory.orgformat import Part, render_entry, render_header
from opencortex.memory.records import MessageRecord, check_thread
from opencortex.memory.threadfile import ArchiveError, locked, read_range

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".forget-tmp"


def parse_before(text: str) -> float:
    """The epoch of DATE (`2026-11-01` or an ISO date and time; UTC unless it says)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--before {text!r} is not a date; use YYYY-MM-DD or an ISO "
                         "date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _goes(record: MessageRecord, before: float | None) -> bool:
    """Whether RECORD is forgotten: a message (not a control record), older than BEFORE."""
    if before is None:
        return True
    return not is_control(record.extra) and record.timestamp < before


def count_forgettable(archive: Archive, thread: Thread, before: float | None = None) -> int:
    """How many messages of THREAD `forget` would remove (nothing changes)."""
    thread = check_thread(thread)
    return sum(1 for record in archive.read_thread(thread)
               if not is_control(record.extra) and _goes(record, before))


def forget(archive: Archive, thread: Thread, before: float | None = None) -> int:
    """Remove THREAD's messages (older than BEFORE, or all) from file and index; the count."""
    thread = check_thread(thread)
    if archive.read_only:
        raise ArchiveError(f"the archive at {archive.root} is open read-only; nothing can be "
                           "forgotten (make the home writable)")
    path = archive.thread_file(thread)
    name = path.relative_to(archive.root).as_posix()
    with archive.lock:
        if not path.exists():
            return 0
        with locked(path, exclusive=True) as fd:
            records = [record for _, record in
                       parse_thread_file(read_range(fd, 0, os.fstat(fd).st_size)).entries
                       if record.thread == thread]
            gone = [r for r in records if not is_control(r.extra) and _goes(r, before)]
            if not gone:
                return 0
            quoting = _quoting({r.id for r in gone}, records)
            kept = [r for r in records if not _goes(r, before) and r.id not in quoting]
            if kept:
                entries, size = _rewrite(path, thread, kept)     # and the directory synced
            else:
                path.unlink()
                sync_directory(path.parent)
                entries, size = [], 0
        archive.replace_indexed(path, entries, size)
    log.info("forgot %d message(s) of %s", len(gone), name)
    return len(gone)


def _quoting(gone: set[str], records: list[MessageRecord]) -> set[str]:
    """The ids of the control records among RECORDS that speak for a span of messages
    (FIRST to LAST, in file order: a compression summary) holding one of GONE, or
    whose span is no longer there: they go with it, since they quote what was said."""
    where = {record.id: number for number, record in enumerate(records)}
    quoting = set()
    for record in records:
        first, last = record.extra.get("FIRST"), record.extra.get("LAST")
        if not is_control(record.extra) or first is None or last is None:
            continue
        span = (where.get(first), where.get(last))
        if None in span or any(records[n].id in gone for n in range(span[0], span[1] + 1)):
            quoting.add(record.id)
    return quoting


def _rewrite(path: Path, thread: Thread, kept: list[MessageRecord]
             ) -> tuple[list[tuple[int, MessageRecord]], int]:
    """Write KEPT as PATH's new content (temporary file, fsync, rename); (offsets, size).

    Each kept entry becomes a complete write of its own (`:PART: 1/1`)."""
    header = render_header(thread).encode("utf-8")
    chunks = [render_entry(record, Part(1, 1)).encode("utf-8") for record in kept]
    entries, offset = [], len(header)
    for record, chunk in zip(kept, chunks, strict=True):
        entries.append((offset, record))
        offset += len(chunk)
    replace_file(path, header + b"".join(chunks),
                 temporary=path.with_name(path.name + TEMP_SUFFIX))
    return entries, offset

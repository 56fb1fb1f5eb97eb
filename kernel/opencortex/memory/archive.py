"""The message archive: one org file per thread (the ground truth) plus a SQLite index.

Layout under ROOT (`$OPENCORTEX_HOME/memory`)::

    index.sqlite                    the derived index (rebuilt when missing or unreadable)
    <channel>/<safe chat id>.org    one file per thread; see `orgformat` for its text

The safe name is the chat id percent-encoded (reversible), shortened with a hash
when very long; the real chat id is always in the file's `#+CHAT_ID:` header.

Writing: all messages of one append go, per thread, into ONE `os.write` on a
file opened with O_APPEND under an exclusive `flock`, followed by `fsync`.
Each entry of that write is marked `:PART: k/N`, so a write (a turn) is one
unit: written whole or not at all.  Before writing, the writer reads the file
backwards only as far as its last write: if that write is incomplete (a crash
mid-write: a torn entry, or fewer than N entries), the whole write is moved to
`<file>.torn-<epoch>` first, and the id of the last complete entry becomes the
PARENT of the new messages.  Readers never see an incomplete write (see
`completeness`).  So the cost of an append does not grow with the size of
memory, and two processes appending to the same file stay safe.  Readers take
a shared `flock`.

The index remembers how many bytes of each file it has seen; on open it reads
only what grew since (and rereads a file that shrank).  After editing archive
files by hand, call `reindex()`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from opencortex.events import Thread
from opencortex.memory.index import MessageIndex
from opencortex.memory.partitions import DEFAULT_TOKENIZER, Partition
from opencortex.memory.completeness import parse_thread_file
from opencortex.memory.orgformat import Part, read_header_chat_id, render_entry, render_header
from opencortex.memory.records import (MessageRecord, NewMessage, SearchHit,
                                       check_thread, check_unicode)
from opencortex.memory.threadfile import (ArchiveError, locked, read_range, settle_tail,
                                          sync_directory, truncate_quietly, write_all)

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite"
MAX_NAME = 180               # bytes of a file name before it is shortened with a hash
HEADER_BYTES = 1 << 16       # bytes read to find a file's #+CHAT_ID: header
MAX_HITS = 1000              # most search hits returned at once
MESSAGE_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}")   # an id given to `append`


class _Written(NamedTuple):
    file: str                                     # path relative to the archive root
    start: int                                    # file size before the write
    end: int                                      # file size after it
    entries: list[tuple[int, MessageRecord]]      # (offset, record) in file order


def safe_name(chat_id: str) -> str:
    """A file-system-safe file stem for CHAT_ID (percent-encoded; hashed when long)."""
    name = quote(chat_id, safe="-_.")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(chat_id.encode("utf-8")).hexdigest()[:16]
        name = f"{name[:MAX_NAME - 17]}~{digest}"
    return name


def _check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a whole number >= 0, not {limit!r}")
    return limit


class Archive:
    """Remembered messages: org files per thread plus a SQLite FTS5 index."""

    def __init__(self, root: Path, *, read_only: bool = False,
                 tokenizer: str = DEFAULT_TOKENIZER):
        """Open the archive at ROOT (created when missing), repairing torn writes.

        READ_ONLY (a home that cannot be written): nothing is created or repaired,
        the index is built in memory from the org files, and `append` refuses.
        TOKENIZER: "porter" (English stemming, the default) or "unicode61"
        (words as written); an index made with another one is rebuilt.
        """
        self.root = Path(root)
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            self._index = MessageIndex(Path(":memory:"), tokenizer=tokenizer)
            with self._lock:
                self._catch_up()
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index = MessageIndex(self.root / INDEX_NAME, tokenizer=tokenizer)
        self.repair()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the index (the org files are closed after every operation)."""
        with self._lock:
            self._index.close()

    @property
    def lock(self) -> threading.RLock:
        """Held while files and index change together (`retention` holds it too)."""
        return self._lock

    def set_partition(self, partition: Partition) -> int:
        """Rank search per owner as PARTITION (thread -> owner name) says: each owner's
        messages are scored with that owner's word statistics.  Threads indexed
        under another owner are moved; returns how many.  Scope is unaffected."""
        with self._lock:
            return self._index.set_partition(partition)

    # -- files -------------------------------------------------------------

    def thread_file(self, thread: Thread) -> Path:
        """The org file holding THREAD's messages."""
        channel, chat_id = check_thread(thread)
        return self.root / channel / f"{safe_name(chat_id)}.org"

    def _name(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _org_files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*/*.org") if p.is_file())

    def threads(self) -> list[Thread]:
        """Every thread with a file in the archive, sorted."""
        found = set()
        for path in self._org_files():
            with path.open("rb") as stream:
                head = stream.read(HEADER_BYTES).split(b"\n*", 1)[0]
            chat_id = read_header_chat_id(head)
            if chat_id is not None:
                found.add(Thread(path.parent.name, chat_id))
            elif head:
                log.warning("%s has no #+CHAT_ID: header; skipped", self._name(path))
        return sorted(found)

    # -- writing -----------------------------------------------------------

    def append(self, messages: Sequence[NewMessage], *,
               ids: Sequence[str] | None = None) -> list[MessageRecord]:
        """Store MESSAGES (one turn) and return their records, in the given order.

        Per thread: one locked, fsynced write.  A message's PARENT is, by default
        ("auto"), the message before it in the batch, or for the first one the
        last complete entry of the file; an explicit id must name a message
        already in the same thread (ValueError otherwise, and nothing is written).

        Every message is validated again first, so one that cannot be stored
        (text with an unpaired surrogate, say, in a message built without
        validation) raises ValueError before anything is written.

        IDS (imports, see `importer`): each message's id instead of a new random
        one; ids must be distinct and not yet in the archive (ValueError otherwise).
        """
        if self.read_only:
            raise ArchiveError(f"the archive at {self.root} is open read-only; nothing "
                               "can be saved (make the home writable, or use another --home)")
        batch = [NewMessage.model_validate(m) for m in messages]
        by_thread: dict[Thread, list[int]] = {}
        for position, message in enumerate(batch):
            by_thread.setdefault(message.thread, []).append(position)
        records: list[MessageRecord | None] = [None] * len(batch)
        now = time.time()
        with self._lock:
            chosen = self._check_ids(ids, len(batch))
            for message in batch:
                if message.parent is not None and message.parent != "auto":
                    self._check_parent(message.thread, message.parent)
            for thread, positions in by_thread.items():
                written = self._append_thread(thread, [batch[p] for p in positions], now,
                                              [chosen[p] for p in positions])
                self._index.add((written.file, offset, rec) for offset, rec in written.entries)
                self._index.set_file_size(written.file, written.end, previous=written.start)
                for position, (_, rec) in zip(positions, written.entries, strict=True):
                    records[position] = rec
        return records

    def known_ids(self, ids: Iterable[str]) -> set[str]:
        """Which of IDS name messages already in the archive (looked up in the index)."""
        with self._lock:
            return {id_ for id_ in ids if self._index.thread_of(id_) is not None}

    def _check_ids(self, ids: Sequence[str] | None, count: int) -> list[str | None]:
        """The id of each of COUNT messages: None (a new random one) or the given one."""
        if ids is None:
            return [None] * count
        if len(ids) != count or len(set(ids)) != count or not all(
                isinstance(id_, str) and MESSAGE_ID.fullmatch(id_) for id_ in ids):
            raise ValueError(f"ids must be {count} distinct ids, one per message, each "
                             "1-128 letters, digits, '.', '_' or '-'")
        if known := self.known_ids(ids):
            raise ValueError(f"{len(known)} of the ids are already in the archive")
        return list(ids)

    def _check_parent(self, thread: Thread, parent: str) -> None:
        """Refuse an explicit PARENT that is not a message of THREAD (looked up in the index)."""
        found = self._index.thread_of(parent)
        if found is None:       # another process may have appended it: catch up, then look again
            path = self.thread_file(thread)
            if path.exists():
                self._catch_up_file(path, self._index.file_sizes().get(self._name(path)))
                found = self._index.thread_of(parent)
        if found != thread:
            where = "is not in the archive" if found is None else "belongs to another thread"
            raise ValueError(f"parent {parent!r} {where}; a message's parent must be an "
                             f"earlier message of the same thread ({thread})")

    def _append_thread(self, thread: Thread, messages: list[NewMessage], now: float,
                       ids: list[str | None]) -> _Written:
        path = self.thread_file(thread)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        name = self._name(path)
        with locked(path, exclusive=True, create=True) as fd:
            size, parent, _ = settle_tail(fd, path, name)
            header = render_header(thread).encode("utf-8") if size == 0 else b""
            records, chunks = [], []
            for number, (message, id_) in enumerate(zip(messages, ids, strict=True), start=1):
                if message.parent != "auto":
                    parent = message.parent
                record = MessageRecord(
                    id=id_ or str(uuid.uuid4()), role=message.role, text=message.text,
                    channel=thread.channel, chat_id=thread.chat_id, sender=message.sender,
                    timestamp=now if message.timestamp is None else message.timestamp,
                    parent=parent, turn_type=message.turn_type, extra=dict(message.extra))
                records.append(record)
                chunks.append(render_entry(record, Part(number, len(messages))).encode("utf-8"))
                parent = record.id
            blob = header + b"".join(chunks)
            try:
                write_all(fd, blob)
                os.fsync(fd)
            except OSError as error:
                truncate_quietly(fd, size)
                raise ArchiveError(
                    f"could not save {len(messages)} message(s) to {name}: {error.strerror or error}; "
                    "free disk space or fix permissions, then retry") from error
            end = os.fstat(fd).st_size
        if size == 0:
            sync_directory(path.parent)
        log.debug("appended %d message(s), %d bytes, to %s", len(records), len(blob), name)
        offset, entries = end - len(blob) + len(header), []
        for record, chunk in zip(records, chunks, strict=True):
            entries.append((offset, record))
            offset += len(chunk)
        return _Written(name, end - len(blob), end, entries)

    # -- reading -----------------------------------------------------------

    def history(self, thread: Thread, limit: int = 20) -> list[MessageRecord]:
        """The last LIMIT messages of THREAD, oldest first (from the index)."""
        thread = check_thread(thread)
        limit = _check_limit(limit)
        with self._lock:
            return self._index.history(thread, limit) if limit else []

    def thread_records(self, thread: Thread) -> list[MessageRecord]:
        """Every message of THREAD in file order, from the index (fast; the index is
        brought up to date with the org file first, which stays the ground truth)."""
        thread = check_thread(thread)
        path = self.thread_file(thread)
        with self._lock:
            if path.exists():
                self._catch_up_file(path, self._index.file_sizes().get(self._name(path)))
            return self._index.thread_records(thread)

    def search(self, query: str, *, thread: Thread | None = None,
               threads: Sequence[Thread] | None = None, limit: int = 10,
               exclude_ids: Collection[str] = (),
               window: tuple[float, float] | None = None) -> list[SearchHit]:
        """Messages matching the words of QUERY, best first (BM25).

        Any word matches (OR); at most 1000 hits.  Scores are -bm25: higher is
        better.  With THREAD and/or THREADS, only messages of those threads (both
        together: their union; an empty THREADS alone: nothing).  Messages whose
        id is in EXCLUDE_IDS and control records are left out.  Very common words
        are skipped while rarer ones remain (see `MessageIndex.search`).  WINDOW
        (start, end epoch seconds): only messages said in that span.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be text, not {type(query).__name__}")
        check_unicode(query, "search query")
        scope = None
        if thread is not None or threads is not None:
            if isinstance(threads, (str, Thread)):
                raise TypeError("threads must be a sequence of Thread, not one thread; "
                                "use thread= for one")
            scope = {check_thread(t) for t in (threads or ())}
            if thread is not None:
                scope.add(check_thread(thread))
        if isinstance(exclude_ids, str):
            raise TypeError("exclude_ids must be a collection of ids, not one string")
        limit = min(_check_limit(limit), MAX_HITS)
        with self._lock:
            if not limit:
                return []
            return self._index.search(query, scope, limit, exclude_ids, window)

    def neighbours(self, message_id: str) -> tuple[MessageRecord | None, MessageRecord | None]:
        """The messages just before and after MESSAGE_ID in its thread (None: none)."""
        with self._lock:
            return self._index.neighbours(message_id)

    def read_thread(self, thread: Thread) -> list[MessageRecord]:
        """Every complete message of THREAD, parsed from its org file with orgparse."""
        thread = check_thread(thread)
        path = self.thread_file(thread)
        if not path.exists():
            return []
        with locked(path, exclusive=False) as fd:
            data = read_range(fd, 0, os.fstat(fd).st_size)
        parsed = parse_thread_file(data)
        if parsed.skipped:
            log.warning("%s: skipped %d malformed entries", self._name(path), parsed.skipped)
        if parsed.length < len(data):
            log.warning("%s ends with an incomplete write of %d bytes; "
                        "Archive.repair() moves it aside", self._name(path),
                        len(data) - parsed.length)
        return [record for _, record in parsed.entries if record.thread == thread]

    # -- maintenance -------------------------------------------------------

    def repair(self) -> list[str]:
        """Move incomplete last writes aside whole (losing nothing), then bring the
        index up to date.

        Returns one report per file that was repaired.
        """
        reports = []
        with self._lock:
            for path in self._org_files():
                with locked(path, exclusive=True) as fd:
                    _, _, report = settle_tail(fd, path, self._name(path))
                if report:
                    reports.append(report)
            self._catch_up()
        return reports

    def replace_indexed(self, path: Path, entries: Sequence[tuple[int, MessageRecord]],
                        size: int) -> None:
        """Index PATH anew as ENTRIES (offset, record) up to SIZE bytes, after `retention`
        rewrote it (or removed it: no entries, size 0)."""
        name = self._name(path)
        with self._lock:
            self._index.forget_file(name)
            if entries:
                self._index.add((name, offset, record) for offset, record in entries)
                self._index.set_file_size(name, size)

    def reindex(self) -> int:
        """Drop the index and rebuild it from the org files; returns the message count."""
        with self._lock:
            self._index.clear()
            self._catch_up()
            return self._index.count()

    def _catch_up(self) -> None:
        """Index what the org files hold beyond what the index has seen."""
        known = self._index.file_sizes()
        names = set()
        for path in self._org_files():
            names.add(self._name(path))
            self._catch_up_file(path, known.get(self._name(path)))
        for gone in known.keys() - names:
            self._index.forget_file(gone)

    def _catch_up_file(self, path: Path, known: int | None) -> None:
        name = self._name(path)
        with locked(path, exclusive=False) as fd:
            size = os.fstat(fd).st_size
            if known == size:
                return
            start = 0
            if known and known < size and read_range(fd, known - 1, known + 1) == b"\n*":
                start = known
            data = read_range(fd, start, size)
        if start == 0:
            self._index.forget_file(name)
        parsed = parse_thread_file(data, base=start)
        added = self._index.add((name, offset, rec) for offset, rec in parsed.entries)
        self._index.set_file_size(name, start + parsed.length)
        log.info("indexed %d message(s) from %s (bytes %d..%d)", added, name, start,
                 start + parsed.length)



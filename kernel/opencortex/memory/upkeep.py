"""Keeping the index in step with the org files: repair, catch-up, reindex.

`IndexUpkeep` is a part of `Archive` (kept apart for size).  On open, the files
the index has not seen at their size (a stat tells) have an incomplete last
write moved aside, then what they hold past what the index has is indexed.

When the index is lost, or an upgrade changes its layout, every message is
indexed again from the org files: about 8 s per 100k messages on a 2-core
machine, and the kernel used to answer nothing meanwhile (Emacs gives up after
`opencortex-start-timeout`, 30 s: past about 250k messages a start failed).
An archive opened with `background=True` (the long-lived kernel) leaves that
work to `BackgroundCatchUp`: the files are indexed a chunk of whole writes at a
time (CHUNK_BYTES), each chunk under the archive's lock and no more, so turns
are written and indexed between chunks and a search sees what is indexed so
far.  A write longer than a chunk (an import writes 1,000 messages at once) is
a chunk of its own, never the rest of the file.  A file changed other than by
appending (edited by hand) is read again from its start the same way, a chunk
at a time, without first dropping its rows (see `reread`: what a search sees
meanwhile).  A thread whose conversation opens meanwhile is caught up whole at
once (`Archive.thread_records`).  Little to do (INLINE_BYTES) is done before
the archive opens, as always; `index_report` tells how far it is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opencortex.memory.index import MessageIndex
from opencortex.memory.layout import org_file_stats
from opencortex.memory.records import MessageRecord
from opencortex.memory.reread import Reread
from opencortex.memory.threadfile import locked, parse_writes, read_range, settle_tail

log = logging.getLogger(__name__)

INLINE_BYTES = 512 << 10    # bytes to index at most before the archive opens (~0.15 s;
                            # 4 MB held a kernel's start 1.2 s)
CHUNK_BYTES = 256 << 10     # bytes of whole writes indexed per hold of the lock (~80 ms)
PAUSE = 0.001               # seconds between two chunks, for whoever waits for the lock
YIELD = 2.0                 # ... or this times what others ran while a chunk was indexed
                            # (Python runs one thread at a time: a start ran at half speed)
STOP_TIMEOUT = 5.0          # seconds `stop` waits for the chunk being indexed


class BackgroundCatchUp:
    """Index FILES in a daemon thread: STEP(path) indexes one chunk of it and says
    whether the file is done; an error ends the work (logged: the next open does the
    rest, as the index records how far each file got)."""

    def __init__(self, files: list[Path], step: Callable[[Path], bool], size: int):
        self.total = len(files)
        self.size = size                     # bytes to index, at the start
        self.done = 0                        # files indexed
        self.failed: str | None = None       # why the work ended early
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(files, step), daemon=True,
                                        name="opencortex-index-catch-up")
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether files are still being indexed."""
        return self._thread.is_alive()

    def _run(self, files: list[Path], step: Callable[[Path], bool]) -> None:
        started = time.monotonic()
        log.info("index: %d file(s), %.1f MB, are indexed in the background; a search "
                 "sees them as they come", self.total, self.size / 1e6)
        for path in files:
            try:
                while True:
                    began, ran = time.monotonic(), time.thread_time()
                    if step(path):
                        break
                    shared = (time.monotonic() - began) - (time.thread_time() - ran)
                    if self._stop.wait(max(PAUSE, YIELD * shared)):
                        return               # (a lock is not fair: a waiting turn takes it)
            except FileNotFoundError:       # removed meanwhile (forgotten): nothing to index
                pass
            except Exception as error:     # a broken disk or index: the next open goes on
                self.failed = f"{type(error).__name__}: {error}"
                log.error("index: catching up stopped at %s (%s); the next start goes on",
                          path.name, type(error).__name__)
                return
            self.done += 1
            if self._stop.is_set():
                return
            time.sleep(PAUSE)
        log.info("index: caught up with the org files in %.1f s", time.monotonic() - started)

    def wait(self, timeout: float) -> bool:
        """Wait at most TIMEOUT seconds for the work to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """End the work after the chunk being indexed; whether it ended within TIMEOUT."""
        self._stop.set()
        return self.wait(timeout)

    def report(self) -> str:
        """How far the work is, for /metrics."""
        if self.running:
            return (f"indexing the org files in the background: {self.done} of {self.total} "
                    "files done; recall sees part of the history until then")
        if self.failed:
            return f"catching up stopped ({self.failed}); the next start goes on"
        return "up to date with the org files"


class IndexUpkeep:
    """Upkeep for an Archive (which provides `root`, `_lock`, `_index`, `_name` and
    `_catching_up`)."""

    root: Path
    _lock: threading.RLock
    _index: MessageIndex
    _catching_up: BackgroundCatchUp | None
    _name: Callable[[Path], str]

    def repair(self) -> list[str]:
        """Move incomplete last writes aside whole (losing nothing), then bring the
        index up to date.

        Returns one report per file that was repaired.
        """
        self._stop_catching_up()
        reports, stats = self._settle_tails()
        self._catch_up(stats=stats)
        return reports

    def _settle_tails(self) -> tuple[list[str], dict[str, tuple[int, int]]]:
        """Move the incomplete last writes of the files the index has not seen whole
        aside: one report per file repaired, and every file's size and modification
        time then.  A file of the size the index has seen ends with the last write
        indexed, which was whole (a size is only recorded after a whole write): a stat
        tells, with no file opened or locked (a start used to open every file twice:
        0.16 s for 2,000 threads)."""
        reports = []
        with self._lock:
            known = self._index.file_sizes()
            stats = org_file_stats(self.root)
            for name, (size, _) in sorted(stats.items()):
                if known.get(name) == size:
                    continue
                path = self.root / name
                with locked(path, exclusive=True) as fd:
                    size, _, report = settle_tail(fd, path, name)
                    stats[name] = (size, os.fstat(fd).st_mtime_ns)
                if report:
                    reports.append(report)
        return reports, stats

    def index_report(self) -> str:
        """Whether the index has all of the org files, for /metrics."""
        catching_up = self._catching_up
        return "up to date with the org files" if catching_up is None else catching_up.report()

    def wait_indexed(self, timeout: float) -> bool:
        """Wait at most TIMEOUT seconds for a background catch-up to end; whether it did."""
        catching_up = self._catching_up
        return catching_up is None or catching_up.wait(timeout)

    def _stop_catching_up(self) -> None:
        catching_up, self._catching_up = self._catching_up, None
        if catching_up is not None and not catching_up.stop():
            log.warning("index: the background catch-up did not stop within %.0f s",
                        STOP_TIMEOUT)

    def replace_indexed(self, path: Path, entries: Sequence[tuple[int, MessageRecord]],
                        size: int) -> None:
        """Index PATH anew as ENTRIES (offset, record) up to SIZE bytes, after `retention`
        rewrote it (or removed it: no entries, size 0)."""
        name = self._name(path)
        with self._lock:
            self._index.forget_file(name)
            if entries:
                self._index.add((name, offset, record) for offset, record in entries)
                try:
                    mtime = path.stat().st_mtime_ns
                except FileNotFoundError:        # removed meanwhile: the next open sees it
                    mtime = 0
                self._index.set_file_size(name, size, mtime=mtime)

    def reindex(self) -> int:
        """Drop the index and rebuild it from the org files; returns the message count."""
        self._stop_catching_up()
        with self._lock:
            self._index.clear()
            self._catch_up()
            return self._index.count()

    def _catch_up(self, *, background: bool = False,
                  stats: dict[str, tuple[int, int]] | None = None) -> None:
        """Index what the org files hold beyond what the index has seen (STATS: every
        file's size and modification time, when just listed); with BACKGROUND, when
        that is over INLINE_BYTES, in a thread (see the module).  The file written last
        is indexed last: rows are numbered as they come, and "the newest matches" are
        the highest numbers (see `RankedSearch.search`)."""
        with self._lock:
            states = self._index.file_states()
            stats = org_file_stats(self.root) if stats is None else stats
            for gone in states.keys() - stats.keys():
                self._index.forget_file(gone)
            rereads = self._index.rereads()
            behind = {}                                       # file -> bytes to read
            for name, (size, mtime) in stats.items():
                known, seen = states.get(name, (None, 0))
                if name in rereads or _edited_keeping_size(known, seen, size, mtime):
                    behind[name] = size               # read again; or the same size, edited
                elif known != size:
                    behind[name] = self._to_read(name, known, size)
            order = sorted(behind, key=self._written_at)
            if not background or sum(behind.values()) <= INLINE_BYTES:
                for name in order:
                    self._catch_up_file(self.root / name)
                return
        self._catching_up = BackgroundCatchUp(
            [self.root / name for name in order], self._catch_up_chunk, sum(behind.values()))

    def _to_read(self, name: str, known: int | None, size: int) -> int:
        """How many bytes of the file NAME (SIZE bytes, KNOWN of them indexed) catching up
        reads: what was appended since, or the whole file when it changed otherwise
        (a hand edit that grew it 7 bytes has the whole file read again)."""
        if not known or known >= size:
            return size
        try:
            with (self.root / name).open("rb") as stream:   # appends leave these bytes be
                stream.seek(known - 1)
                appended = stream.read(2) == b"\n*"
        except OSError:
            return size
        return size - known if appended else size

    def _written_at(self, name: str) -> tuple[int, str]:
        """When the file NAME was last written (and its name, for a tie)."""
        try:
            return (self.root / name).stat().st_mtime_ns, name
        except FileNotFoundError:
            return 0, name

    def _catch_up_chunk(self, path: Path) -> bool:
        """Index the next CHUNK_BYTES or so of PATH (whole writes); whether all is."""
        with self._lock:
            return self._catch_up_file(path, limit=CHUNK_BYTES)

    def _catch_up_file(self, path: Path, *, limit: int | None = None) -> bool:
        """Index what PATH holds past what the index has (all of it, or the whole writes
        of about LIMIT bytes: a chunk, however long the file); whether the index then
        has all of it.  A file changed other than by appending is read again from its
        start (see `reread`).  Called under the archive's lock."""
        name = self._name(path)
        with locked(path, exclusive=False) as fd:
            stat = os.fstat(fd)
            size = stat.st_size
            reread = self._index.reread_of(name)
            if reread is not None and not reread.fits(fd, stat):
                log.info("%s changed again while read again; read from its start", name)
                reread = Reread.of(stat)
            if reread is None:
                known, seen = self._index.file_state(name) or (None, 0)
                edited = _edited_keeping_size(known, seen, size, stat.st_mtime_ns)
                if known == size and not edited:
                    return True
                if edited:
                    log.info("%s changed, keeping its size; it is read again", name)
                    reread = Reread.of(stat)
                elif known and (known > size or
                                read_range(fd, known - 1, known + 1) != b"\n*"):
                    log.info("%s changed other than by appending; it is read again", name)
                    reread = Reread.of(stat)
            if reread is not None:
                return reread.step(self._index, name, fd, size, limit)
            start = known or 0
            parsed = parse_writes(fd, start, size, limit)
        if start == 0:
            self._index.forget_file(name)
        added = self._index.add((name, offset, rec) for offset, rec in parsed.entries)
        self._index.set_file_size(name, start + parsed.length, mtime=stat.st_mtime_ns)
        log.info("indexed %d message(s) from %s (bytes %d..%d)", added, name, start,
                 start + parsed.length)
        return limit is None or not parsed.length or start + parsed.length >= size


def _edited_keeping_size(known: int | None, seen: int, size: int, mtime: int) -> bool:
    """Whether a file of SIZE bytes and modification time MTIME, indexed up to KNOWN bytes
    as it was at time SEEN (0: unknown, trusted), was edited in place since."""
    return known == size and seen not in (0, mtime)

"""A changed thread file read again: its index rows made to agree, a chunk at a time.

A thread file whose indexed size no longer ends a write of it (or lies past its
end) was changed other than by appending: a typo fixed by hand, checkpoint
lines removed.  Its rows used to be dropped and the file indexed again whole in
one hold of the archive's lock (20 s for a thread of 100k messages, before a
kernel could answer).  `Reread` instead reads it from its start a chunk of
whole writes at a time (see `upkeep`), and of each message read:

- one indexed as it is, at the same place, is left alone;
- one that only moved (the edit was before it) gets its new offset;
- one that changed, or is new, replaces its old row (if any).

Once the whole file is read, every row of the file whose message is not at its
offset in the file (removed or moved by the edit) is deleted, a batch at a time
(the sweep); only then is the file's size recorded.  How far the re-read is, is
kept in the index's `meta` table (key "reread:FILE"), in the transaction of
each chunk: a crash or a stop (a one-shot command ends) loses nothing, and the
next catch-up goes on from there.  So the index equals the file when the
re-read ends.

Meanwhile a search, the history and the neighbours of a message see each
message of the file either as the file now holds it (read already) or as it
was indexed before the edit (not read yet): an edited message with its old
text, a removed one until the sweep, an added one once read; never two rows
for one message.  Offsets before and after the point reached are of the new
and the old file: near that point the history's order may be off by the size
of the edit until the re-read ends.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING

from opencortex.memory.partitions import Partitions
from opencortex.memory.records import MessageRecord
from opencortex.memory.rows import COLUMNS, row_values
from opencortex.memory.threadfile import entry_id_at, parse_writes, read_range

if TYPE_CHECKING:
    from opencortex.memory.index import MessageIndex

SWEEP_ROWS = 2000           # rows looked at per hold of the lock by the sweep (~40 ms at most)
KEY = "reread:"             # `meta` key of a file's re-read: KEY + file

IdAt = Callable[[int], "str | None"]      # the id of the entry at an offset of the file


@dataclass
class Reread:
    """How far the re-read of one file is (kept in the index while it goes on)."""

    device: int                    # the file's device and inode when the re-read began
    inode: int
    offset: int = 0                # bytes of the file read so far (whole writes)
    swept: int | None = None       # the sweep's last row looked at (None: reading)

    @classmethod
    def of(cls, stat: os.stat_result) -> Reread:
        """A re-read of the file STAT describes, beginning now."""
        return cls(stat.st_dev, stat.st_ino)

    def fits(self, fd: int, stat: os.stat_result) -> bool:
        """Whether the open file FD (of STAT) is still the one being read again, with a
        write beginning where the re-read is (not replaced or cut short since)."""
        return (stat.st_dev, stat.st_ino) == (self.device, self.inode) and (
            self.offset in (0, stat.st_size) or
            (self.offset < stat.st_size and
             read_range(fd, self.offset - 1, self.offset + 1) == b"\n*"))

    def step(self, index: MessageIndex, file: str, fd: int, size: int,
             limit: int | None) -> bool:
        """Read the whole writes of about LIMIT more bytes of FILE (open as FD, SIZE bytes)
        and make INDEX agree; once all is read, sweep SWEEP_ROWS rows.  Without LIMIT,
        all of it at once.  Whether the re-read ended (FILE's size is then recorded)."""
        id_at = partial(entry_id_at, fd)
        if self.swept is None:
            parsed = parse_writes(fd, self.offset, size, limit)
            start, self.offset = self.offset, self.offset + parsed.length
            if limit is None or not parsed.length or self.offset >= size:
                self.swept = 0             # all read (but a tail of no whole write)
            index.reconcile(file, parsed.entries, start, id_at, self)
            if limit is not None:
                return False
        while not index.sweep(file, id_at, SWEEP_ROWS if limit else None, self):
            if limit is not None:
                return False
        index.end_reread(file, self.offset, os.fstat(fd).st_mtime_ns)
        return True


class IndexRereads:
    """The index's part of a re-read, for a MessageIndex (which provides `_db`, `_parts`,
    `_write`, `_insert`, `_forgot` and `set_file_size`)."""

    _db: sqlite3.Connection
    _parts: Partitions
    set_file_size: Callable[..., bool]             # see `index.MessageIndex`

    def rereads(self) -> dict[str, Reread]:
        """The re-reads under way, by file."""
        return {key.removeprefix(KEY): Reread(**json.loads(value)) for key, value in
                self._db.execute("SELECT key, value FROM meta WHERE key >= ? AND key < ?",
                                 (KEY, KEY[:-1] + chr(ord(KEY[-1]) + 1)))}

    def reread_of(self, file: str) -> Reread | None:
        """How far the re-read of FILE is (None: none is under way)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (KEY + file,)).fetchone()
        return None if row is None else Reread(**json.loads(row[0]))

    def _keep(self, file: str, reread: Reread) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         (KEY + file, json.dumps(asdict(reread))))

    def end_reread(self, file: str, size: int, mtime: int) -> None:
        """The re-read of FILE ended: FILE is indexed up to SIZE bytes, as it was at
        modification time MTIME (ns)."""
        def work() -> None:
            self._db.execute("DELETE FROM meta WHERE key = ?", (KEY + file,))
            self.set_file_size(file, size, mtime=mtime)
        self._write(work)

    def reconcile(self, file: str, entries: list[tuple[int, MessageRecord]], start: int,
                  id_at: IdAt, reread: Reread) -> int:
        """Make FILE's rows agree with ENTRIES ((offset, record) in file order, from START
        on) read again from it, and keep REREAD, in one transaction.  An id that an
        earlier entry of FILE holds (ID_AT tells: an entry copied by hand) or that was
        indexed from another file is passed over, as indexing passes over an id indexed
        already.  Returns how many rows were added, moved or replaced."""
        gone: list[int] = []
        changed = 0

        def work() -> None:
            nonlocal changed
            ids = json.dumps([record.id for _, record in entries])
            old = {row[3]: row for row in self._db.execute(
                f"SELECT seq, file, offset, {COLUMNS} FROM messages "
                "WHERE id IN (SELECT value FROM json_each(?))", (ids,))}
            moved, fresh, met = [], [], set()
            for offset, record in entries:
                row = old.get(record.id)
                if record.id in met or row is not None and (row[1] != file or (
                        row[2] < start and row[2] != offset and id_at(row[2]) == record.id)):
                    continue
                met.add(record.id)
                if row is None:
                    fresh.append((file, offset, record))
                elif tuple(row[3:]) != row_values(record):
                    gone.append(row[0])
                    fresh.append((file, offset, record))
                elif row[2] != offset:
                    moved.append((offset, row[0]))
            self._drop_rows(gone)
            self._db.executemany("UPDATE messages SET offset = ? WHERE seq = ?", moved)
            changed = len(moved) + self._insert(fresh)
            self._keep(file, reread)
        self._write(work)
        if gone:
            self._forgot()
        return changed

    def sweep(self, file: str, id_at: IdAt, batch: int | None, reread: Reread) -> bool:
        """Delete those of BATCH rows of FILE (all without BATCH) numbered past
        `REREAD.swept` whose message is not at their offset in FILE (ID_AT tells), and
        keep REREAD moved on, in one transaction.  Whether no row was left to look at."""
        rows = self._db.execute(
            "SELECT seq, id, offset FROM messages WHERE file = ? AND seq > ? ORDER BY seq "
            "LIMIT ?", (file, reread.swept, -1 if batch is None else batch)).fetchall()
        if not rows:
            return True
        gone = [seq for seq, id_, offset in rows if id_at(offset) != id_]
        reread.swept = rows[-1][0]

        def work() -> None:
            self._drop_rows(gone)
            self._keep(file, reread)
        self._write(work)
        if gone:
            self._forgot()
        return False

    def _drop_rows(self, seqs: list[int]) -> None:
        """Delete the rows numbered SEQS, from `messages` and their tables (inside a
        transaction)."""
        if seqs:
            listed = (json.dumps(seqs),)
            self._parts.delete_where("seq IN (SELECT value FROM json_each(?))", listed)
            self._db.execute("DELETE FROM messages WHERE seq IN (SELECT value FROM "
                             "json_each(?))", listed)

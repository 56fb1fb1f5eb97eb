"""What the Matrix bridge keeps between runs, besides matrix-nio's crypto store.

One SQLite file, `HOME/bridges/matrix/state.sqlite3` (directory 0700, file 0600):

- `values`: the sync position (`next_batch`, written only once the bridge has
  kept what was fetched up to it), the device id, and — after a password
  login — the account's access token, so a restart reuses the same login and
  device instead of piling up new ones;
- `seen`: the bridge position given to each Matrix event id.  A Matrix sync
  token is not a number, but the bridge's inbox orders messages by an integer
  position: each event gets one the first time it is fetched, and the same one
  when a sync from an older token (after a crash) brings it again, so the inbox
  recognises it and nothing is handled twice.  Positions grow with time (at
  least the current time in microseconds), so they stay above every earlier
  one even if this file is lost.  Only the newest `KEEP` events are remembered.

Every write is one transaction, fsynced (WAL, synchronous=FULL); the bridge makes
its per-sync writes (positions, the sync token) on a worker thread, off the loop.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

KEEP = 20_000   # event ids remembered; older ones lie far behind the sync position

SCHEMA = """
CREATE TABLE IF NOT EXISTS "values" (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seen (event_id TEXT PRIMARY KEY, position INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS seen_by_position ON seen (position);
"""


def private_directory(path: Path) -> Path:
    """PATH as a directory only its owner can enter (created if missing)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class MatrixState:
    """The bridge's own durable state for one Matrix account."""

    def __init__(self, directory: Path):
        private_directory(directory)
        path = directory / "state.sqlite3"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(descriptor)
        os.chmod(path, 0o600)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def get(self, key: str) -> str:
        """The value kept under KEY ("" when none)."""
        row = self._db.execute('SELECT value FROM "values" WHERE key = ?', (key,)).fetchone()
        return row[0] if row else ""

    def put(self, **values: str) -> None:
        """Keep VALUES (an empty value forgets its key), in one transaction."""
        with self._db:
            for key, value in values.items():
                if value:
                    self._db.execute('INSERT OR REPLACE INTO "values" VALUES (?, ?)',
                                     (key, value))
                else:
                    self._db.execute('DELETE FROM "values" WHERE key = ?', (key,))

    def positions(self, event_ids: list[str]) -> tuple[dict[str, int], set[str]]:
        """A position for each of EVENT_IDS (kept), and which of them were seen before."""
        known: dict[str, int] = {}
        for event_id in event_ids:
            row = self._db.execute("SELECT position FROM seen WHERE event_id = ?",
                                   (event_id,)).fetchone()
            if row:
                known[event_id] = row[0]
        fresh = [event_id for event_id in dict.fromkeys(event_ids) if event_id not in known]
        if fresh:
            last = self._db.execute("SELECT max(position) FROM seen").fetchone()[0] or 0
            start = max(last + 1, time.time_ns() // 1000)
            assigned = {event_id: start + index for index, event_id in enumerate(fresh)}
            with self._db:
                self._db.executemany("INSERT INTO seen VALUES (?, ?)", assigned.items())
                self._db.execute("DELETE FROM seen WHERE position <= (SELECT position FROM seen "
                                 "ORDER BY position DESC LIMIT 1 OFFSET ?)", (KEEP,))
        else:
            assigned = {}
        return {**known, **assigned}, set(known)

    def close(self) -> None:
        self._db.close()

"""What budgets have used, kept in `HOME/budgets.sqlite` so they survive a restart.

One row per (key, period): a key is a thread ("session:telegram:42") or an
owner ("owner:alice"); a period is a UTC day ("2026-11-23") for budgets that
renew daily, or "always".  Rows hold the tokens and dollars used, the tokens
an owner granted on top, and whether the short-answer tier was announced.

The kernel reads and counts in memory (the rows are read once, when the store
opens: one kernel per home; a row is a few dozen bytes), so a turn never
waits for the disk on the event loop.  Each change is written by the store's
own thread, in order, as an increment committed with `synchronous = FULL`
(fsynced); `close` waits for them.  A crash can lose the changes of the last
moments (a budget then allows that little more), never a count written before.

Daily rows are needed only while their day lasts (and the day before, for a
turn that began before midnight): `prune` drops older ones, in memory and on
disk, when the store opens (`keep_from`) and whenever the budgets see a new
day, so strangers' chats day after day do not pile up.  "always" rows stay:
a budget that never renews needs them.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

STORE_NAME = "budgets.sqlite"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key TEXT NOT NULL, period TEXT NOT NULL,
    tokens INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0,
    granted INTEGER NOT NULL DEFAULT 0, announced INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, period))
"""


@dataclass(frozen=True)
class Used:
    """What one key used in one period."""

    tokens: int = 0
    cost: float = 0.0
    granted: int = 0
    announced: bool = False


class BudgetStore:
    """Usage counters per key and period: in memory, written through to one SQLite file."""

    def __init__(self, path: Path, *, keep_from: str | None = None):
        """Open (or create) the store at PATH; with KEEP_FROM ("YYYY-MM-DD"), the daily
        rows of earlier days are deleted first, never read into memory."""
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute(_SCHEMA)
        if keep_from is not None:
            self._delete_before(keep_from)
        self._used: dict[tuple[str, str], Used] = {
            (key, period): Used(tokens, cost, granted, bool(announced))
            for key, period, tokens, cost, granted, announced in self._db.execute(
                "SELECT key, period, tokens, cost, granted, announced FROM usage")}
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="opencortex-budgets")
        self._closed = False

    def close(self) -> None:
        """Write what was counted, then close the file."""
        if self._closed:
            return
        self._closed = True
        self._disk.shutdown(wait=True)
        self._db.close()

    def used(self, key: str, period: str) -> Used:
        """What KEY used in PERIOD (zeros when nothing yet)."""
        return self._used.get((key, period), Used())

    def _add(self, key: str, period: str, **amounts: float) -> None:
        """Add AMOUNTS (column -> increment) to KEY's row for PERIOD, in memory at once and
        on disk by the store's thread (not after `close`: the kernel has stopped)."""
        now = self.used(key, period)
        self._used[(key, period)] = replace(now, **{
            column: (getattr(now, column) + amount if column != "announced" else True)
            for column, amount in amounts.items()})
        if not self._closed:
            self._disk.submit(self._write, key, period, amounts).add_done_callback(_logged)

    def _write(self, key: str, period: str, amounts: dict[str, float]) -> None:
        """One change, committed (in the store's thread)."""
        columns = ", ".join(f"{column} = {column} + ?" for column in amounts)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("INSERT OR IGNORE INTO usage (key, period) VALUES (?, ?)",
                             (key, period))
            self._db.execute(f"UPDATE usage SET {columns} WHERE key = ? AND period = ?",
                             (*amounts.values(), key, period))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def prune(self, keep_from: str) -> int:
        """Forget the daily rows of days before KEEP_FROM ("YYYY-MM-DD"): from memory at
        once, from disk by the store's thread ("always" rows stay); how many went."""
        _check_day(keep_from)
        old = [row for row in self._used if _DAY.fullmatch(row[1]) and row[1] < keep_from]
        for row in old:
            del self._used[row]
        if not self._closed:
            self._disk.submit(self._delete_before, keep_from).add_done_callback(_logged)
        return len(old)

    def _delete_before(self, keep_from: str) -> None:
        """Delete the daily rows of days before KEEP_FROM (in the store's thread)."""
        _check_day(keep_from)
        self._db.execute("DELETE FROM usage WHERE period < ? AND period GLOB "
                         "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]'", (keep_from,))

    def rows(self) -> int:
        """How many (key, period) rows are held in memory."""
        return len(self._used)

    def charge(self, key: str, period: str, tokens: int, cost: float) -> None:
        """Add TOKENS and COST to what KEY used in PERIOD."""
        self._add(key, period, tokens=tokens, cost=cost)

    def grant(self, key: str, period: str, tokens: int) -> None:
        """Let KEY use TOKENS more in PERIOD (an owner said yes)."""
        self._add(key, period, granted=tokens)

    def mark_announced(self, key: str, period: str) -> None:
        """Remember that the short-answer tier was announced for KEY in PERIOD."""
        if not self.used(key, period).announced:
            self._add(key, period, announced=1)


def _logged(written: Future) -> None:
    """Log a change that could not be written (what failed, never a key's text)."""
    error = written.exception()
    if error is not None:
        log.error("budget store: a change could not be written (%s); it counts until the "
                  "kernel stops", type(error).__name__)


def _check_day(day: str) -> None:
    """ValueError unless DAY is a "YYYY-MM-DD" period."""
    if not isinstance(day, str) or not _DAY.fullmatch(day):
        raise ValueError(f"a daily period is YYYY-MM-DD, not {day!r}")

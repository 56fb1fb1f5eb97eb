"""What budgets have used, kept in `HOME/budgets.sqlite` so they survive a restart.

One row per (key, period): a key is a thread ("session:telegram:42") or an
owner ("owner:alice"); a period is a UTC day ("2026-11-23") for budgets that
renew daily, or "always".  Rows hold the tokens and dollars used, the tokens
an owner granted on top, and whether the short-answer tier was announced.
Writes are committed with `synchronous = FULL` (fsynced) before the kernel
goes on.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

STORE_NAME = "budgets.sqlite"
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
    """Usage counters per key and period, in one SQLite file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def used(self, key: str, period: str) -> Used:
        """What KEY used in PERIOD (zeros when nothing yet)."""
        with self._lock:
            row = self._db.execute(
                "SELECT tokens, cost, granted, announced FROM usage WHERE key = ? AND period = ?",
                (key, period)).fetchone()
        return Used() if row is None else Used(row[0], row[1], row[2], bool(row[3]))

    def _bump(self, key: str, period: str, column: str, amount: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO usage (key, period) VALUES (?, ?)",
                             (key, period))
            self._db.execute(f"UPDATE usage SET {column} = {column} + ? "
                             "WHERE key = ? AND period = ?", (amount, key, period))

    def charge(self, key: str, period: str, tokens: int, cost: float) -> None:
        """Add TOKENS and COST to what KEY used in PERIOD."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR IGNORE INTO usage (key, period) VALUES (?, ?)",
                                 (key, period))
                self._db.execute("UPDATE usage SET tokens = tokens + ?, cost = cost + ? "
                                 "WHERE key = ? AND period = ?", (tokens, cost, key, period))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def grant(self, key: str, period: str, tokens: int) -> None:
        """Let KEY use TOKENS more in PERIOD (an owner said yes)."""
        self._bump(key, period, "granted", tokens)

    def mark_announced(self, key: str, period: str) -> None:
        """Remember that the short-answer tier was announced for KEY in PERIOD."""
        self._bump(key, period, "announced", 1)

"""A log line for an event a hostile peer can repeat at will: at most one per interval.

A wrong secret, a refused connection, a broken frame: each says what happened
once, then counts, so a flood of them costs a line a minute, not a disk.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("opencortex.epc")


class ThrottledLog:
    """Logs one kind of event at most once per INTERVAL seconds, counting the rest."""

    def __init__(self, message: str, *, level: int = logging.WARNING, interval: float = 60.0,
                 logger: logging.Logger = log):
        self.message = message
        self.level = level
        self.logger = logger
        self.interval = interval
        self._lock = threading.Lock()
        self._count = 0
        self._next_at = 0.0

    def __call__(self, detail: str = "") -> None:
        """Count one event; log it (with the count since the last line) when due."""
        with self._lock:
            self._count += 1
            now = time.monotonic()
            if now < self._next_at:
                return
            count, self._count, self._next_at = self._count, 0, now + self.interval
        repeats = "" if count == 1 else f" ({count} times since the last report)"
        self.logger.log(self.level, "%s%s%s", self.message, detail, repeats)

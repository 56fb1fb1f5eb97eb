"""A stall watchdog: cancels the streaming task when one wait for the provider lasts too long.

`asyncio.timeout` around every chunk costs ~5 µs a chunk (a timer handle each
time); this costs two attribute stores a chunk and one timer per period.  Only
time spent *waiting for the provider* counts: the caller marks the wait with
`waiting()` / `arrived()`, so a slow consumer between chunks is never a stall.
"""

from __future__ import annotations

import asyncio

TOLERANCE = 0.001  # the loop may run a timer this much early


class StallWatch:
    """Cancels the current task once a marked wait exceeds `timeout` seconds."""

    def __init__(self, timeout: float):
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "StallWatch needs a running task"
        self.task = task
        self.timeout = timeout
        self.since: float | None = None
        self.fired = False
        self._undone = False
        self._handle = self.loop.call_at(self.loop.time() + timeout, self._check)

    def waiting(self) -> None:
        """A wait for the provider starts now."""
        self.since = self.loop.time()

    def arrived(self) -> None:
        """The wait ended: something came."""
        self.since = None

    def change(self, timeout: float) -> None:
        """Use TIMEOUT from now on (e.g. the stall timeout once the first chunk came)."""
        self.timeout = timeout
        self._handle.cancel()
        base = self.since if self.since is not None else self.loop.time()
        self._handle = self.loop.call_at(base + timeout, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        if self.since is not None and now - self.since >= self.timeout - TOLERANCE:
            self.fired = True
            self.task.cancel()
            return
        base = self.since if self.since is not None else now
        self._handle = self.loop.call_at(base + self.timeout, self._check)

    def caused(self, error: BaseException) -> bool:
        """Did this watchdog cause ERROR (its CancelledError, or whatever a library made of
        it)?  Then the cancellation is undone, once, and the wait was a stall."""
        if not self.fired or self._undone:
            return False
        self._undone = True
        self.task.uncancel()
        return True

    def close(self) -> None:
        self._handle.cancel()

"""Exactly one kernel per home: two writers on one archive must never happen.

`HomeLock` holds an exclusive `flock` on `HOME/kernel.lock` for the life of a
`serve` process and records who holds it (pid, EPC port) in the file, so a
second `serve` on the same home is refused with a message naming the running
one.  The lock goes with the process: a kernel killed with SIGKILL leaves no
stale lock behind (the file may stay; its lock does not).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

LOCK_NAME = "kernel.lock"


class HomeInUse(RuntimeError):
    """Another kernel runs on this home; the message names it."""


def holder(home: Path) -> dict[str, Any]:
    """What the running kernel of HOME wrote into its lock file ({} if nothing)."""
    try:
        return json.loads((home / LOCK_NAME).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


class HomeLock:
    """The home's lock, held until `release` (or the process ends)."""

    def __init__(self, home: Path):
        self.path = home / LOCK_NAME
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            running = holder(home)
            where = f" (pid {running.get('pid', '?')}, EPC port {running.get('port', '?')})"
            raise HomeInUse(f"a kernel is already running for {home}{where}; connect to it "
                            "(M-x opencortex-chat does), or stop it first") from None

    def record(self, **facts: Any) -> None:
        """Write FACTS (pid, port, …) into the lock file for others to read."""
        data = json.dumps({"pid": os.getpid(), **facts}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        try:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
        except OSError:
            pass

"""A bridge's durable inbox: no message is lost, none is handled twice.

Platforms acknowledge delivery in batches (Telegram confirms a whole batch by
asking for the next), while a turn may take minutes (a model, an approval).
So the bridge writes each fetched message here — one JSON line, fsynced —
before it acknowledges it to the platform, and marks it done once handled:
its turn archived, or deliberately dropped (a stranger, a flood).  On start the
messages not marked done are handed out again; one whose turn was archived
before the crash is recognised by its platform message id in the archive (see
`opencortex.bridges.service`) and not answered twice.

The file lives in the kernel home (mode 0600).  It holds message text only
until the message is done: when nothing is pending it is rewritten to one line
recording the highest position seen, so redelivered old positions are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from opencortex.bridges.inbound import Inbound

log = logging.getLogger(__name__)

COMPACT_AFTER = 1000   # done lines before the file is rewritten (when nothing is pending)


class Inbox:
    """Pending messages of one bridge, kept on disk."""

    def __init__(self, path: Path):
        self.path = path
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.high = -1                       # highest position ever added
        self._pending: dict[int, Inbound] = {}
        self._lines = 0
        self._load()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in raw.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue                     # a line torn by a crash: it was never acknowledged
            self._apply(record)
            self._lines += 1

    def _apply(self, record: dict) -> None:
        if "add" in record:
            message = Inbound(**record["add"])
            self.high = max(self.high, message.position)
            self._pending[message.position] = message
        elif "done" in record:
            self._pending.pop(int(record["done"]), None)
        elif "high" in record:
            self.high = max(self.high, int(record["high"]))

    def _write(self, records: list[dict]) -> None:
        data = b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")
                        + b"\n" for r in records)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        self._lines += len(records)

    def add(self, messages: list[Inbound]) -> list[Inbound]:
        """Keep MESSAGES not seen before (durably); return those, in position order."""
        fresh = sorted((m for m in messages if m.position > self.high),
                       key=lambda m: m.position)
        if fresh:
            self._write([{"add": dataclasses.asdict(m)} for m in fresh])
            for message in fresh:
                self._pending[message.position] = message
            self.high = fresh[-1].position
        return fresh

    def done(self, position: int) -> None:
        """POSITION is handled; it will not be handed out again."""
        if self._pending.pop(position, None) is None:
            return
        self._write([{"done": position}])
        if not self._pending and self._lines > COMPACT_AFTER:
            self._compact()

    def pending(self) -> list[Inbound]:
        """Messages not yet handled, oldest first."""
        return [self._pending[p] for p in sorted(self._pending)]

    def _compact(self) -> None:
        """Rewrite the file as one line: nothing is pending, only the high mark matters."""
        temporary = self.path.with_name(self.path.name + ".new")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                             0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(json.dumps({"high": self.high}).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._lines = 1

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass

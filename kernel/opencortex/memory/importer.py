"""Earlier history into the archive: what `opencortex memory import FILE` does.

Two formats, told apart by the start of the file (see `import_source`) or named:

- JSON Lines: one object per line with `thread` (as `Thread.parse` reads it:
  `telegram:42`, or a bare chat id on cli; a line without one goes to the
  THREAD given), `role` (user, assistant or system), `sender` (text or null),
  `timestamp` (ISO 8601, local time when it names no zone, or epoch seconds)
  and `text`.  Other keys are ignored.
- A Telegram Desktop export of one chat (`result.json`): see `telegram_export`.

Every message keeps its original time and is stored like any other, through
`Archive.append` (whole writes per thread, indexed for search).  Its id is
derived from a stable key (JSON Lines: thread, time, sender and text; Telegram:
thread and message id), so a message already in the archive is found by an
index lookup of its id and left out: importing a file again adds nothing.  A
Telegram message the bridge archived is found too: by its PLATFORM_ID (the
Telegram message id, in the same thread) where the export's ids are the bot's
(see `telegram_export`), else as the same side's same text at nearly the same
time (see `bridged`), the bot's own replies included.

The file is opened and read once (`ImportSource`), so a pipe works too.  It may
bring any number of owners: past the first few hundred, owners share search
tables until they grow (see `partitions`).

Memory stays bounded: the file is read a line (or a Telegram message) at a
time; messages wait per thread and are written BATCH at a time (one locked,
fsynced write per thread and one index transaction), and at most MAX_PENDING
messages (MAX_PENDING_CHARS of text) wait in all.

A line or message that cannot be read is reported by its line (or position)
and skipped; the rest is imported, and fixing the file and importing it again
adds just what was skipped.  A file that cannot be read on (a Telegram export
cut short, say) stops the import once everything read before it is saved.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Union

from pydantic import ValidationError

from opencortex.events import Thread
from opencortex.memory.archive import Archive
from opencortex.memory.bridged import BridgedCopies
from opencortex.memory.import_source import ImportFailed, ImportSource  # noqa: F401
from opencortex.memory.partitions import Partition
from opencortex.memory.records import ROLES, NewMessage, check_thread
from opencortex.memory.rows import IMPORTED

FORMATS = ("jsonl", "telegram")
NAMESPACE = uuid.UUID("0c7f6a1e-3d2b-5e8f-9a41-6b2d8c0e4f17")   # of the ids imports derive
BATCH = 1000                 # messages of one thread written (and indexed) together
MAX_PENDING = 10_000         # messages waiting to be written, over all threads
MAX_PENDING_CHARS = 32 << 20  # characters of text waiting to be written
MAX_LINE_BYTES = 4 << 20     # a longer JSON line is reported and skipped
MAX_NAME = 512               # characters of a sender or chat id
MAX_SHOWN = 20               # problems kept to show; the rest are counted
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


class BadMessage(ValueError):
    """One line or message cannot be imported; the message says why (never its content)."""


class Item(NamedTuple):
    """A message to import, the id derived from its stable key, and the texts a bridge
    may have archived it under (none: no bridge could have; see `bridged`)."""

    id: str
    message: NewMessage
    bridge_texts: tuple[str, ...] = ()


class Problem(NamedTuple):
    """A line or message that was skipped: WHERE ("line 12") and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


# What a format reader yields: a message, a skipped one, or None (nothing to keep).
Read = Union[Item, Problem, None]


@dataclass
class ImportReport:
    """What an import did."""

    format: str
    added: int = 0                  # messages written
    duplicates: int = 0             # already in the archive (or twice in the file)
    ignored: int = 0                # Telegram service messages, empty messages
    problems: int = 0               # lines or messages skipped as unreadable
    shown: list[Problem] = field(default_factory=list)   # the first MAX_SHOWN of them
    threads: dict[str, int] = field(default_factory=dict)  # thread -> messages added
    older: int = 0                  # added messages older than their thread's last one
    stopped: str | None = None      # why the import stopped early, if it did

    def problem(self, problem: Problem) -> None:
        """Count PROBLEM; keep it to show when fewer than MAX_SHOWN are kept."""
        self.problems += 1
        if len(self.shown) < MAX_SHOWN:
            self.shown.append(problem)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"format": self.format, "added": self.added, "duplicates": self.duplicates,
                "ignored": self.ignored, "skipped": self.problems,
                "problems": [str(p) for p in self.shown], "threads": dict(self.threads),
                "older": self.older, "stopped": self.stopped}


# -- shared by the format readers -------------------------------------------

def parse_time(value: Any) -> float:
    """Epoch seconds from VALUE: a number, digits, or ISO 8601 (no zone: local time)."""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _NUMBER.fullmatch(value):
            return float(value)
        if isinstance(value, str):
            return datetime.fromisoformat(value.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadMessage("timestamp is not ISO 8601 or epoch seconds") from None
    raise BadMessage("timestamp must be ISO 8601 text or epoch seconds")


def check_name(value: Any, what: str) -> str | None:
    """VALUE as a sender or chat name: text of at most MAX_NAME characters, or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadMessage(f"{what} must be text or null")
    if len(value) > MAX_NAME:
        raise BadMessage(f"{what} is longer than {MAX_NAME} characters")
    return value


def parse_thread(value: Any) -> Thread:
    """A thread as `Thread.parse` reads it, checked as the archive checks it."""
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise BadMessage(f"thread must be CHANNEL:CHAT-ID text of at most {MAX_NAME} characters")
    return check_thread(Thread.parse(value))


def make_item(key: Iterable[str], where: str, bridge_texts: tuple[str, ...] = (),
              **fields: Any) -> Item | Problem:
    """The message FIELDS describe, with the id derived from KEY (and BRIDGE_TEXTS, see
    `Item`); a Problem if invalid."""
    try:
        message = NewMessage(**fields)
    except ValidationError as error:
        return Problem(where, "; ".join(_reason(e) for e in error.errors(
            include_input=False, include_url=False)[:3]))
    return Item(str(uuid.uuid5(NAMESPACE, "\x1f".join(key))), message, bridge_texts)


def _reason(error: dict[str, Any]) -> str:
    """One pydantic error in words, naming its field unless the message already does."""
    field_name = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    return message if message.startswith(field_name) else f"{field_name}: {message}"


# -- JSON Lines --------------------------------------------------------------

def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(number, line) for each line; None for a line longer than MAX_LINE_BYTES."""
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):       # skip the rest of it
                line = stream.readline(1 << 20)
            yield number, None
        else:
            yield number, line


def jsonl_values(stream: BinaryIO) -> Iterator[tuple[str, Any]]:
    """(where, the JSON value of the line, or a Problem) for each line of a JSON Lines
    file that is not blank."""
    for number, line in _lines(stream):
        where = f"line {number}"
        if line is None:
            yield where, Problem(where, f"longer than {MAX_LINE_BYTES} bytes")
            continue
        if number == 1:
            line = line.removeprefix(b"\xef\xbb\xbf")
        if not line.strip():
            continue
        try:
            yield where, json.loads(line)
        except ValueError:
            yield where, Problem(where, "not valid JSON (or not UTF-8)")
        except RecursionError:
            yield where, Problem(where, "nests too deeply to be read")


def jsonl_items(stream: BinaryIO, default_thread: Thread | None) -> Iterator[Read]:
    """The messages of a JSON Lines file, a line at a time (blank lines are skipped)."""
    repeats = _Repeats()
    for where, data in jsonl_values(stream):
        if isinstance(data, Problem):
            yield data
            continue
        try:
            yield _jsonl_item(data, where, default_thread, repeats)
        except (BadMessage, ValueError) as error:
            yield Problem(where, str(error))


class _Repeats:
    """Which time a message comes among those of its thread said at the same time: lines
    with the same thread, time, sender and text in one such run are that many messages
    ("ok", "lol", "ok" within a minute of a file with times in minutes), each with a key
    of its own (the first the plain one); the same line again after the thread's time
    moved on is the same message.  Memory is bounded (past it, a repeat is one message)."""

    THREADS = 1024               # threads whose current time is remembered
    KEYS = 10_000                # keys remembered for one thread and time

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, dict[bytes, int]]] = {}   # thread -> time, seen

    def key(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """KEY (its format, thread, time, ...), made its run's Nth (N > 0) by a last part."""
        thread, when = key[1], key[2]
        at, seen = self._runs.get(thread, ("", {}))
        if at != when:
            if len(self._runs) >= self.THREADS:
                self._runs.clear()
            at, seen = self._runs[thread] = (when, {})
        digest = hashlib.blake2b("\x1f".join(key).encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()        # not the text itself
        count = seen.get(digest, 0)
        if count or len(seen) < self.KEYS:
            seen[digest] = count + 1
        return (*key, str(count)) if count else key


def line_thread(data: dict[str, Any], default_thread: Thread | None) -> Thread | None:
    """The thread a JSON line's object names, else DEFAULT_THREAD (BadMessage or
    ValueError when it names one that cannot be read)."""
    return default_thread if data.get("thread") is None else parse_thread(data["thread"])


def _jsonl_item(data: Any, where: str, default_thread: Thread | None,
                repeats: _Repeats) -> Item | Problem:
    """One JSON Lines object as a message to import (BadMessage when it is not one)."""
    if not isinstance(data, dict):
        raise BadMessage("not a JSON object")
    thread = line_thread(data, default_thread)
    if thread is None:
        raise BadMessage("thread is missing (or pass --thread)")
    role = data.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadMessage(f"role must be one of {', '.join(ROLES)}")
    sender = check_name(data.get("sender"), "sender")
    when = parse_time(data.get("timestamp"))
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadMessage("text must be non-empty text")
    key = repeats.key(("jsonl", str(thread), repr(when), sender or "", text))
    return make_item(key, where,
                     role=role, text=text, thread=thread, sender=sender, timestamp=when,
                     extra={IMPORTED: "jsonl"})


# -- writing -------------------------------------------------------------------

class _Writer:
    """Messages waiting per thread, written BATCH at a time; duplicates are left out."""

    def __init__(self, archive: Archive, report: ImportReport):
        self.archive, self.report = archive, report
        self.pending: dict[Thread, list[Item]] = {}
        self.waiting: set[str] = set()               # ids of the pending messages
        self.chars = 0
        self.last: dict[Thread, float] = {}          # each thread's last time before the import
        self.copies = BridgedCopies(archive)         # what bridges archived already

    def add(self, item: Item) -> None:
        """Queue ITEM unless it is already in the archive or queued; write when full."""
        if item.id in self.waiting or self.archive.known_ids((item.id,)) or \
                self.copies.archived(item):
            self.report.duplicates += 1
            return
        thread = item.message.thread
        if thread not in self.last:
            newest = self.archive.history(thread, 1)
            self.last[thread] = newest[-1].timestamp if newest else -math.inf
        queue = self.pending.setdefault(thread, [])
        queue.append(item)
        self.waiting.add(item.id)
        self.chars += len(item.message.text)
        if len(queue) >= BATCH:
            self.flush(thread)
        elif len(self.waiting) >= MAX_PENDING or self.chars >= MAX_PENDING_CHARS:
            self.flush_all()

    def flush(self, thread: Thread) -> None:
        """Write THREAD's waiting messages: one whole write, one index transaction."""
        items = self.pending.pop(thread, [])
        if not items:
            return
        self.archive.append([item.message for item in items], ids=[item.id for item in items])
        report, last = self.report, self.last[thread]
        report.added += len(items)
        report.threads[str(thread)] = report.threads.get(str(thread), 0) + len(items)
        report.older += sum(1 for item in items if item.message.timestamp < last)
        for item in items:
            self.waiting.discard(item.id)
            self.chars -= len(item.message.text)

    def flush_all(self) -> None:
        """Write every thread's waiting messages."""
        for thread in list(self.pending):
            self.flush(thread)


def import_file(archive: Archive, path: Path, *, fmt: str = "auto",
                thread: Thread | None = None, assistants: Iterable[str] = (),
                partition: Partition | None = None) -> ImportReport:
    """Import the messages of the file at PATH into ARCHIVE; returns what was done.

    FMT: "auto" (told from the file), "jsonl" or "telegram".  THREAD: where a
    Telegram export goes (default: from its chat id), and the thread of JSON
    lines that name none.  ASSISTANTS: Telegram senders (names or ids) whose
    messages are the assistant's.  PARTITION: each thread's owner (default: the
    archive's), set on ARCHIVE before the first write.  Run it as the archive's
    only writer (the CLI holds the
    home's lock): duplicates are found through the index.
    """
    if fmt not in ("auto", *FORMATS):
        raise ImportFailed(f"unknown format {fmt!r}; use one of auto, {', '.join(FORMATS)}")
    assistants = list(assistants)
    with ImportSource(path) as source:
        chosen = source.format() if fmt == "auto" else fmt
        if assistants and chosen != "telegram":
            raise ImportFailed("--assistant applies to Telegram exports; each JSON line "
                               "names its own role")
        if partition is not None:
            archive.set_partition(partition)
        return _import_stream(archive, source.stream(), chosen, thread, assistants)


def _import_stream(archive: Archive, stream: BinaryIO, chosen: str, thread: Thread | None,
                   assistants: list[str]) -> ImportReport:
    """Import the messages of STREAM, a file of the format CHOSEN (see `import_file`)."""
    report = ImportReport(chosen)
    writer = _Writer(archive, report)
    if chosen == "jsonl":
        items = jsonl_items(stream, thread)
    else:
        from opencortex.memory.telegram_export import telegram_items
        items = telegram_items(stream, thread, assistants)
    try:
        for read in items:
            if read is None:
                report.ignored += 1
            elif isinstance(read, Problem):
                report.problem(read)
            else:
                writer.add(read)
    except ImportFailed as error:
        report.stopped = str(error)
    writer.flush_all()
    return report

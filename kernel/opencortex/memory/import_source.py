"""The file an import reads, opened and read once: its format told from its start.

A file may be a pipe or a FIFO (`/dev/stdin`, `<(zcat chat.jsonl.gz)`): what
is read of it cannot be read again.  So `ImportSource` reads the start of the
file once (`read_head`), tells the format from it (`format_of`), and gives it
back in front of the rest (`stream`): nothing read to tell the format is lost.

Telling the formats apart: a Telegram Desktop export is one JSON object over
many lines (Telegram Desktop writes `{` alone on the first line) with a
`messages` list; a JSON Lines file is one whole object per line.  So a first
line that is one whole JSON object is JSON Lines, unless nothing follows it
and it looks like an export (a `messages` list or a whole-account key, and no
`role`).  Other keys in a JSON line (`type`, `name`, even `messages`) say nothing.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, BinaryIO

BOM = b"\xef\xbb\xbf"
DETECT_BYTES = 1 << 16       # bytes read at a time to tell the format
MAX_HEAD = 4 << 20           # most bytes read to tell it (a first line this long is cut)
READ_BUFFER = 1 << 16        # the buffer of the stream an import reads
# Top-level keys of a whole-account export (not one chat).
ACCOUNT_KEYS = frozenset({"about", "personal_information", "chats", "contacts",
                          "frequent_contacts", "left_chats", "profile_pictures"})
_TELEGRAM_START = re.compile(rb'\{\s*"(name|type|about|personal_information|chats)"\s*:')


class ImportFailed(ValueError):
    """The file cannot be imported (at all, or from some point on); says why and what to do."""


def read_head(stream: BinaryIO) -> tuple[bytes, bool]:
    """The start of STREAM, enough to tell its format, and whether it is all of it.

    At least DETECT_BYTES, and on until the first line that is not blank has ended
    and something follows it, or MAX_HEAD bytes were read."""
    head = bytearray()
    while len(head) < MAX_HEAD:
        chunk = stream.read(DETECT_BYTES)
        if not chunk:
            return bytes(head), True
        head += chunk
        _, newline, rest = _body(head).partition(b"\n")
        if newline and rest.strip():
            break
    return bytes(head), False


def _body(head: bytes | bytearray) -> bytes:
    """HEAD without a byte order mark and leading blanks."""
    return bytes(head).removeprefix(BOM).lstrip()


def format_of(head: bytes, ended: bool, name: object) -> str:
    """"jsonl" or "telegram", told from HEAD, the start of the file NAME (ENDED: all of
    it); ImportFailed if it is neither, suggesting --format."""
    body = _body(head)
    if not body:
        if ended:
            raise ImportFailed(f"{name} is empty: there is nothing to import")
        raise _neither(name)
    first, newline, rest = body.partition(b"\n")
    first = first.strip()
    if first == b"{":                                 # as Telegram Desktop writes it
        return "telegram"
    data = _object(first) if newline or ended else None
    if data is not None:
        alone = ended and not rest.strip()
        return "telegram" if alone and _looks_like_export(data) else "jsonl"
    second = rest.lstrip().split(b"\n", 1)[0].strip()
    if _object(second) is not None:                   # a bad first line, then JSON lines
        return "jsonl"
    if _TELEGRAM_START.match(body):                   # an export's first line, or a
        return "telegram"                             # one-line export cut or broken
    if first.startswith(b"{") and not newline and not ended:
        return "jsonl"                                # a first line longer than MAX_HEAD
    raise _neither(name)


def _object(line: bytes) -> dict[str, Any] | None:
    """LINE as a JSON object, or None when it is not one whole object."""
    if not line.startswith(b"{"):
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _looks_like_export(data: dict[str, Any]) -> bool:
    """Whether the object DATA is a Telegram export rather than one message."""
    if "role" in data:
        return False
    return isinstance(data.get("messages"), list) or not ACCOUNT_KEYS.isdisjoint(data)


def _neither(name: object) -> ImportFailed:
    return ImportFailed(f"{name} is neither JSON Lines (one message object per line) nor a "
                        "Telegram Desktop chat export (result.json); if it is one of them, "
                        "pass --format jsonl or --format telegram to say which")


def detect_format(path: Path) -> str:
    """"jsonl" or "telegram", from the start of the file at PATH (ImportFailed if neither)."""
    with Path(path).open("rb") as stream:
        return format_of(*read_head(stream), path)


class _Replayed(io.RawIOBase):
    """HEAD, then the rest of FILE: the file as if its start had not been read yet."""

    def __init__(self, head: bytes, file: BinaryIO):
        self._head, self._file = memoryview(head), file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        """Fill BUFFER from what is left of the head, else from the file."""
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        return self._file.readinto(buffer) or 0


class ImportSource:
    """The file at PATH, opened once; its start is read to tell its format."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file: BinaryIO = self.path.open("rb")
        try:
            self.head, self.ended = read_head(self._file)
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> ImportSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def format(self) -> str:
        """The file's format, told from its start (see `format_of`)."""
        return format_of(self.head, self.ended, self.path)

    def stream(self) -> BinaryIO:
        """The file from its start, read once."""
        head, self.head = self.head, b""
        return io.BufferedReader(_Replayed(head, self._file), READ_BUFFER)

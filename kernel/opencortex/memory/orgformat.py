"""The org text of the archive: one heading per message, exact round trip.

File layout: a header written once (`#+TITLE:`, `#+CHANNEL:`, `#+CHAT_ID:`),
then one level-1 heading per message::

    * assistant [2026-11-22 Sun 01:55]
    :PROPERTIES:
    :ID:       <uuid4>
    :ROLE:     assistant
    ...
    :BODY_LINES: 1
    :END:
    <body>

Every entry written by one append (for one thread) carries `:PART: k/N`: it is
the k-th of the N entries of that write.  A write is one unit, a turn: the
complete part of a file ends after the last entry whose PART is `N/N` (or that
has no PART, as in files written before it existed); see `completeness`.

Property values are single lines.  They are percent-encoded (UTF-8 bytes as
`%XX`) only where org would misread them: `%` itself, `[` and `<` (dates),
control characters, line separators, whitespace at either end, and the `:` of
`:END:` or `:PROPERTIES:`.  Everything else stays literal, so `:SENDER: alice` reads as is.

The body is the message text split on "\\n"; the entry always writes exactly
those lines, each followed by "\\n", so trailing newlines survive exactly
(orgparse joins body lines with "\\n").  Lines that org would read as structure
get org's escape, a leading `,`: a line whose first character after any
leading commas is `*`, a line starting (after blanks) with `#+`, and drawer
lines like `:END:`.  A line that already starts with commas before such a
token gets one more; reading removes exactly one.  Texts that orgparse would
otherwise mangle (line separators other than "\\n" such as "\\r", U+2028 or
form feed; `[`/`<` followed by a digit, which orgparse reads as dates and
crashes on when invalid; `- State "..."` lines it silently drops) are stored
with `:BODY_ENCODING: percent`: `%`, `[`, `<` and those separators are
percent-encoded before the comma escape.  So are texts holding C0/C1 control
characters other than "\\n" and "\\t" (NUL, the ESC of ANSI escape sequences,
DEL, ...): they are written as `%XX`, so the file stays plain text a person can read.

`:BODY_LINES:` records how many body lines were written.  A last entry that
does not end in "\\n", lacks its drawer or required properties, or has fewer
body lines than recorded is torn (a crash mid-write), and so is the write it
belongs to; see `completeness`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import NamedTuple
from urllib.parse import unquote

from opencortex.events import Thread
from opencortex.memory.records import ROLES, MessageRecord

REQUIRED_KEYS = ("ID", "ROLE", "CHANNEL", "CHAT_ID", "EPOCH", "TURN_TYPE", "BODY_LINES")
STANDARD_KEYS = frozenset(REQUIRED_KEYS) | {"SENDER", "TIMESTAMP", "PARENT", "BODY_ENCODING",
                                             "PART"}
PERCENT = "percent"

# Characters str.splitlines() (and so orgparse.loads) treats as line breaks, besides "\n".
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# A regex class body: the C0 and C1 control characters except "\n" and "\t", and DEL.
CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f"
_BODY_NEEDS_PERCENT = re.compile(rf"[{CONTROLS}{LINE_BREAKS}]|[\[<]\d|-\s+State\s")
_BODY_PERCENTED = re.compile(rf"[%\[<{CONTROLS}{LINE_BREAKS}]")
# A value `encode_value` leaves as it is (but for `_DRAWER_WORD`): no `%`, `[`, `<`, line
# break or control character (Unicode category Cc), and no blank at either end.
_VALUE_PLAIN = re.compile(rf"(?!\s)[^%\[<\x00-\x1f\x7f-\x9f{LINE_BREAKS}]*(?<!\s)")
_PART = re.compile(r"([1-9][0-9]{0,8})/([1-9][0-9]{0,8})")
_STRUCTURE = re.compile(r"\*|\s*#\+|\s*:[\w-]*:\s*\Z")
_DRAWER_WORD = re.compile(r":(?=(?:end|properties):)", re.IGNORECASE)
_HEADING = re.compile(r"\* (\w+)(?: .*)?")
_PROPERTY = re.compile(r":([A-Z0-9_]+):(?: +(.*))?")


class EntryError(ValueError):
    """An entry is incomplete or malformed; the message says what is missing."""


class Part(NamedTuple):
    """An entry's place in the write that stored it: the NUMBER-th of TOTAL entries."""

    number: int
    total: int

    def __str__(self) -> str:
        return f"{self.number}/{self.total}"


class Entry(NamedTuple):
    """One strictly parsed entry: its record and its PART (None in files older than PART)."""

    record: MessageRecord
    part: Part | None


def parse_part(value: str) -> Part:
    """The Part that a `:PART:` value `k/N` names (1 <= k <= N); EntryError if malformed."""
    match = _PART.fullmatch(value)
    if match is None or int(match.group(1)) > int(match.group(2)):
        raise EntryError(f"entry has a malformed PART {value[:40]!r}")
    return Part(int(match.group(1)), int(match.group(2)))


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8"))


def encode_value(value: str) -> str:
    """Encode VALUE so that it reads back exactly as one org property value."""
    if _VALUE_PLAIN.fullmatch(value):          # most values: nothing to encode
        return _DRAWER_WORD.sub("%3A", value)
    last = len(value) - 1
    out = []
    for i, char in enumerate(value):
        edge_blank = char.isspace() and (i == 0 or i == last)
        if char in "%[<" or edge_blank or char in LINE_BREAKS \
                or unicodedata.category(char) == "Cc":
            out.append(_percent(char))
        else:
            out.append(char)
    return _DRAWER_WORD.sub("%3A", "".join(out))


def decode_value(value: str) -> str:
    """Inverse of `encode_value`."""
    return unquote(value, errors="strict")


def _is_structure(line: str) -> bool:
    return _STRUCTURE.match(line.lstrip(",")) is not None


def encode_body(text: str) -> tuple[list[str], bool]:
    """Return the body lines to write for TEXT and whether percent encoding was used."""
    percent = _BODY_NEEDS_PERCENT.search(text) is not None
    if percent:
        text = _BODY_PERCENTED.sub(lambda m: _percent(m.group()), text)
    return ["," + line if _is_structure(line) else line for line in text.split("\n")], percent


def decode_body(lines: Iterable[str], percent: bool) -> str:
    """Inverse of `encode_body`."""
    text = "\n".join(line[1:] if line.startswith(",") and _is_structure(line) else line
                     for line in lines)
    return unquote(text, errors="strict") if percent else text


def _property_line(key: str, value: str) -> str:
    label = _LABELS.get(key) or f"{':' + key + ':':<10} "
    return (label + value).rstrip(" ")


_LABELS = {key: f"{':' + key + ':':<10} " for key in (
    "ID", "ROLE", "CHANNEL", "CHAT_ID", "SENDER", "TIMESTAMP", "EPOCH", "PARENT", "TURN_TYPE",
    "BODY_LINES", "BODY_ENCODING", "PART")}        # every entry's: padded once


def render_header(thread: Thread) -> str:
    """The lines written once at the top of a new thread file."""
    channel, chat_id = thread
    return (f"#+TITLE: Messages in {encode_value(str(thread))}\n"
            f"#+CHANNEL: {channel}\n"
            f"#+CHAT_ID: {encode_value(chat_id)}\n\n")


def render_entry(record: MessageRecord, part: Part | None = None) -> str:
    """The org text of one message: heading, property drawer, body; ends with "\\n".

    PART, written as `:PART: k/N`, says which entry of its write this one is.
    """
    lines, percent = encode_body(record.text)
    when = datetime.fromtimestamp(record.timestamp)
    props = [("ID", record.id), ("ROLE", record.role), ("CHANNEL", record.channel),
             ("CHAT_ID", encode_value(record.chat_id))]
    if record.sender is not None:
        props.append(("SENDER", encode_value(record.sender)))
    stamp = f"{when:%Y-%m-%d %a %H:%M:%S}"
    props += [("TIMESTAMP", f"[{stamp}]"),
              ("EPOCH", repr(float(record.timestamp))),
              ("PARENT", record.parent or ""),
              ("TURN_TYPE", record.turn_type),
              ("BODY_LINES", str(len(lines)))]
    if percent:
        props.append(("BODY_ENCODING", PERCENT))
    if part is not None:
        props.append(("PART", str(part)))
    props += [(key, encode_value(value)) for key, value in sorted(record.extra.items())]
    out = [f"* {record.role} [{stamp[:-3]}]", ":PROPERTIES:"]      # to the minute
    out += [_property_line(key, value) for key, value in props]
    out.append(":END:")
    out += lines
    return "\n".join(out) + "\n"


def record_from_fields(props: Mapping[str, str], body_lines: list[str], *,
                       check_length: bool) -> MessageRecord:
    """Build a record from an entry's raw property values and raw body lines.

    With CHECK_LENGTH, fewer body lines than `:BODY_LINES:` says is an EntryError
    (the entry was cut short); more lines are accepted (a hand edit).
    """
    missing = [key for key in REQUIRED_KEYS if key not in props]
    if missing:
        raise EntryError(f"entry lacks properties {', '.join(missing)}")
    try:
        expected = int(props["BODY_LINES"])
        epoch = float(props["EPOCH"])
    except ValueError:
        raise EntryError("entry has a malformed BODY_LINES or EPOCH") from None
    if check_length and len(body_lines) < expected:
        raise EntryError(f"entry has {len(body_lines)} body lines, BODY_LINES says {expected}")
    encoding = props.get("BODY_ENCODING", "")
    if encoding not in ("", PERCENT):
        raise EntryError(f"entry has unknown BODY_ENCODING {encoding!r}")
    if "PART" in props:
        parse_part(props["PART"])
    try:
        return MessageRecord(
            id=props["ID"], role=props["ROLE"], channel=props["CHANNEL"],
            chat_id=decode_value(props["CHAT_ID"]),
            text=decode_body(body_lines, encoding == PERCENT),
            sender=decode_value(props["SENDER"]) if "SENDER" in props else None,
            timestamp=epoch, parent=props.get("PARENT") or None,
            turn_type=props["TURN_TYPE"],
            extra={key: decode_value(value) for key, value in props.items()
                   if key not in STANDARD_KEYS})
    except ValueError as error:   # pydantic's ValidationError and bad UTF-8 escapes
        raise EntryError(f"entry has invalid values: {error}") from None


def parse_entry(data: bytes) -> MessageRecord:
    """Strictly parse the bytes of ONE entry (heading to end); EntryError if torn or malformed."""
    return read_entry(data).record


def read_entry(data: bytes) -> Entry:
    """Like `parse_entry`, with the entry's PART (None when it has none)."""
    if not data.endswith(b"\n"):
        raise EntryError("entry does not end with a newline")
    try:
        lines = data[:-1].decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise EntryError("entry is not valid UTF-8") from None
    heading = _HEADING.fullmatch(lines[0])
    if heading is None or heading.group(1) not in ROLES:
        raise EntryError("entry heading is not '* <role> [...]'")
    if len(lines) < 2 or lines[1] != ":PROPERTIES:":
        raise EntryError("entry lacks its property drawer")
    props: dict[str, str] = {}
    for number, line in enumerate(lines[2:], start=2):
        if line == ":END:":
            record = record_from_fields(props, lines[number + 1:], check_length=True)
            return Entry(record, parse_part(props["PART"]) if "PART" in props else None)
        match = _PROPERTY.fullmatch(line)
        if match is None:
            raise EntryError(f"entry line {number + 1} is not a property")
        props[match.group(1)] = match.group(2) or ""
    raise EntryError("entry property drawer has no :END:")


def read_header_chat_id(head: bytes) -> str | None:
    """The chat id recorded in a file header (the bytes before the first entry), or None."""
    match = re.search(rb"(?m)^#\+CHAT_ID: (.*)$", head)
    if match is None:
        return None
    try:
        return decode_value(match.group(1).decode("utf-8"))
    except ValueError:   # bad UTF-8 in the file or in an escape
        return None

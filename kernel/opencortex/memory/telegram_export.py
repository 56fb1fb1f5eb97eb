"""A Telegram Desktop chat export (`result.json`) as messages to import, read as a stream.

Telegram Desktop ("Export chat history", format JSON) writes one object:
`name`, `type`, `id`, then `messages`, a list of objects with `id`, `type`
("message" or "service"), `date` (local time), `date_unixtime`, `from`,
`from_id` ("user123"), `text` (a string, or a list of strings and
{type, text} entity objects) and `text_entities`.  The file is read a chunk
at a time (a byte order mark is passed over) and each message decoded on its
own (at most MAX_VALUE_CHARS), so an export of any size needs little memory.
A byte that is not UTF-8 stops the import there, once every message before it
is imported, and is reported by its byte offset.

- Thread: the THREAD given, else telegram:<chat id> spelt as the Bot API (and
  so the Telegram bridge) spells it: groups -ID, supergroups and channels -100ID.
- Sender: `from_id` without its "user" prefix (the bridge's sender id); the
  display name goes into a SENDER_NAME property, cleaned as the bridges clean
  it (`events.display_name`: one line, cut short), never refusing the message.
- Role: "assistant" for a sender named in ASSISTANTS (by name, from_id or
  number); "user" for everyone else, the person and other people alike.
- Service messages (joins, pins, calls) and messages with nothing to keep are
  left out and counted; media, polls, contacts, places become a note such as
  "[photo]" before any caption (see `telegram_content`).
- The stable key is the thread and the Telegram message id (kept as SOURCE_ID),
  so importing a later export of the same chat adds only what is new.
- In a supergroup or channel, message ids are the chat's own, the same for the
  bot as for whoever exported the chat: there the id is kept as PLATFORM_ID
  too, as the Telegram bridge keeps the id of a message it archives, and a
  message the bridge archived already is not imported again.  In a private chat
  or a basic group each account numbers messages its own way: the export's ids
  are not the bot's, and neither is compared nor kept as PLATFORM_ID.  There
  (and for the bot's own replies, which carry no PLATFORM_ID anywhere) a message
  the bridge archived is recognised by side, text and time (see `bridged`): the
  item carries the texts the bridge may have archived, the message as exported
  and as the bot received it (a caption without the "[photo]" note, links
  without their address).
- Times: `date_unixtime` (Telegram's own, in whole seconds) when the export has
  it; else `date`, the exporting machine's local time, read as this machine's.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from opencortex.events import Thread, display_name
from opencortex.memory.import_source import ACCOUNT_KEYS
from opencortex.memory.importer import (MAX_NAME, BadMessage, ImportFailed, Problem, Read,
                                        check_name, make_item, parse_time)
from opencortex.memory.rows import IMPORTED, PLATFORM_ID, SENDER_NAME
from opencortex.memory.telegram_content import message_text, received_text

CHUNK = 1 << 20              # bytes read at a time
MAX_VALUE_CHARS = 4 << 20    # a larger message (or header value) stops the import
CUT_MARGIN = 16              # a JSON error this close to the buffer's end may be a cut token
_BLANK = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()
# The Bot API's chat id is the export's id with this prefix, by chat type.
_PREFIX = {"private_group": "-", "private_supergroup": "-100", "public_supergroup": "-100",
           "private_channel": "-100", "public_channel": "-100"}
# Chat types whose message ids are the chat's own (the bot's too): not per account.
SHARED_IDS = frozenset(kind for kind, prefix in _PREFIX.items() if prefix == "-100")
WHOLE_ACCOUNT = ("this is a whole-account Telegram export; export one chat instead "
                 "(in the chat: ⋮ → Export chat history, format JSON)")


class JsonStream:
    """One JSON document read from a binary file a chunk at a time, value by value."""

    def __init__(self, stream: BinaryIO):
        self._file = stream
        self._utf8 = codecs.getincrementaldecoder("utf-8-sig")()
        self._buf, self._pos, self._dropped, self._eof = "", 0, 0, False
        self._read = 0                            # bytes read from the file
        self._bad: ImportFailed | None = None     # raised once the text before it is read

    def _more(self) -> bool:
        """Read another chunk into the buffer; False at the end of the file.  Past a
        byte that is not UTF-8, the text before it is read, then ImportFailed."""
        if self._bad is not None:
            raise self._bad
        if self._eof:
            return False
        chunk = self._file.read(CHUNK)
        self._eof = not chunk
        self._read += len(chunk)
        try:
            text = self._utf8.decode(chunk, final=self._eof)
        except UnicodeDecodeError as error:
            text = self._before_bad_byte(error)
        self._dropped += self._pos
        self._buf, self._pos = self._buf[self._pos:] + text, 0
        return bool(chunk) or self._bad is not None

    def _before_bad_byte(self, error: UnicodeDecodeError) -> str:
        """The text before the byte ERROR is about; the error to raise once it is read."""
        undecoded = error.object             # ends with the last byte read
        offset = self._read - len(undecoded) + error.start
        self._bad = ImportFailed(f"the Telegram export is not UTF-8 at byte {offset}; the "
                                 "messages before it were imported")
        self._eof = True
        return bytes(undecoded[:error.start]).decode("utf-8")

    def error(self, what: str) -> ImportFailed:
        """ImportFailed saying WHAT is wrong, and where."""
        return ImportFailed(f"the Telegram export {what} near character "
                            f"{self._dropped + self._pos}; the messages before it were imported")

    def peek(self) -> str:
        """The next character that is not blank ("" at the end of the file)."""
        while True:
            self._pos = _BLANK.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return ""

    def take(self, expected: str) -> str:
        """Consume the next character, which must be one of EXPECTED."""
        char = self.peek()
        if not char or char not in expected:
            raise self.error(f"is not valid JSON (expected {' or '.join(expected)})")
        self._pos += 1
        return char

    def value(self) -> Any:
        """Decode the next JSON value (at most MAX_VALUE_CHARS long)."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as error:   # broken, or cut off by the buffer's end
                if not error.msg.startswith("Unterminated") and \
                        error.pos < len(self._buf) - CUT_MARGIN:
                    self._pos = error.pos
                    raise self.error(f"is not valid JSON ({error.msg})") from None
                value, end = None, None
            except RecursionError:
                raise self.error("nests too deeply") from None
            if end is not None and (end < len(self._buf) or self._eof):
                self._pos = end
                return value
            if len(self._buf) - self._pos > MAX_VALUE_CHARS:
                raise self.error(f"holds a value longer than {MAX_VALUE_CHARS} characters")
            if not self._more():
                if end is None:
                    raise self.error("is not valid JSON (or ends too early)")
                self._pos = end
                return value


def chat_thread(header: dict[str, Any]) -> Thread:
    """The thread of the exported chat, from the export's `id` and `type`."""
    chat_id = header.get("id")
    if not isinstance(chat_id, int) or isinstance(chat_id, bool):
        raise ImportFailed("the Telegram export names no chat id; pass --thread "
                           "telegram:CHAT-ID")
    prefix = _PREFIX.get(header.get("type"), "") if chat_id > 0 else ""
    return Thread("telegram", f"{prefix}{chat_id}")


def telegram_items(stream: BinaryIO, thread: Thread | None,
                   assistants: Sequence[str]) -> Iterator[Read]:
    """The messages of a Telegram Desktop chat export, one at a time."""
    reader = JsonStream(stream)
    reader.take("{")
    header: dict[str, Any] = {}
    while reader.peek() != "}":
        key = reader.value()
        if not isinstance(key, str):
            raise reader.error("is not valid JSON (expected a key)")
        reader.take(":")
        if key == "messages":
            shared_ids = header.get("type") in SHARED_IDS
            yield from _messages(reader, thread or chat_thread(header), set(assistants),
                                 shared_ids)
            return                                  # nothing after the messages matters
        if key in ACCOUNT_KEYS:
            raise ImportFailed(WHOLE_ACCOUNT)
        header[key] = reader.value()
        if reader.take(",}") == "}":
            break
    raise ImportFailed("the file has no `messages` list; is it a Telegram Desktop chat "
                       "export (result.json, format JSON)?")


def _messages(reader: JsonStream, thread: Thread, assistants: set[str],
              shared_ids: bool) -> Iterator[Read]:
    """The items of the `messages` list, decoded one at a time (SHARED_IDS: see
    `message_item`)."""
    reader.take("[")
    if reader.peek() == "]":
        return
    position = 0
    while True:
        position += 1
        yield message_item(reader.value(), position, thread, assistants, shared_ids)
        if reader.take(",]") == "]":
            return


def message_item(data: Any, position: int, thread: Thread, assistants: set[str],
                 shared_ids: bool = False) -> Read:
    """One exported message as a message to import, a Problem, or None (nothing to keep).
    SHARED_IDS: the chat's message ids are the bot's too (kept as PLATFORM_ID)."""
    if not isinstance(data, dict):
        return Problem(f"message {position}", "not a JSON object")
    number = data.get("id")
    known = isinstance(number, int) and not isinstance(number, bool)
    where = f"message {position}" + (f" (id {number})" if known else "")
    if data.get("type") != "message":
        return None
    try:
        if not known:
            raise BadMessage("id must be a whole number")
        if "date_unixtime" not in data and "date" not in data:
            raise BadMessage("date is missing")
        when = parse_time(data.get("date_unixtime", data.get("date")))
        text = message_text(data)
        name = data.get("from")
        if name is not None and not isinstance(name, str):
            raise BadMessage("from must be text or null")
        name = display_name(name) if name else None     # anyone's choice: cleaned, kept
        from_id = check_name(data.get("from_id"), "from_id")
    except BadMessage as error:
        return Problem(where, str(error))
    if not text.strip():
        return None
    sender = from_id.removeprefix("user") if from_id else name
    role = "assistant" if assistants & {name, from_id, sender} else "user"
    extra = {IMPORTED: "telegram", "SOURCE_ID": str(number)}
    if shared_ids:
        extra[PLATFORM_ID] = str(number)
    if name:
        extra[SENDER_NAME] = name
    for key, prop in (("reply_to_message_id", "REPLY_TO"), ("forwarded_from", "FORWARDED_FROM")):
        value = data.get(key)
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value):
            extra[prop] = str(value)[:MAX_NAME]
    received = received_text(data)
    bridge_texts = tuple(dict.fromkeys(t.strip() for t in (text, received) if t.strip()))
    return make_item(("telegram", str(thread), str(number)), where, bridge_texts, role=role,
                     text=text, thread=thread, sender=sender, timestamp=when, extra=extra)

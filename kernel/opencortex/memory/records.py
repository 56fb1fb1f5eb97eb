"""The shapes of remembered messages: what the kernel hands in, what is on disk.

`NewMessage` is what the kernel asks the archive to store; `MessageRecord` is
what the archive stored (with its id, exact timestamp and parent);
`SearchHit` is a record found by full-text search, with its score and snippet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opencortex.events import Thread

Role = Literal["user", "assistant", "system"]
TurnType = Literal["speech", "action", "thought", "yield", "silence"]

ROLES: tuple[str, ...] = ("user", "assistant", "system")
TURN_TYPES: tuple[str, ...] = ("speech", "action", "thought", "yield", "silence")

# Property names the archive writes itself; `extra` may not reuse them.
RESERVED_KEYS = frozenset({
    "ID", "ROLE", "CHANNEL", "CHAT_ID", "SENDER", "TIMESTAMP", "EPOCH", "PARENT",
    "TURN_TYPE", "BODY_LINES", "BODY_ENCODING", "PART", "END", "PROPERTIES",
})
EXTRA_KEY = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
CHANNEL_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# Epoch seconds the org timestamps can show: 1970 up to (not including) year 3000.
LATEST_EPOCH = 32503680000.0


def check_unicode(value: str, what: str) -> str:
    """Refuse strings that cannot be written as UTF-8 (unpaired surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = value[error.start]
        raise ValueError(
            f"{what} contains an unpaired surrogate U+{ord(bad):04X} at index "
            f"{error.start}; pass valid Unicode text") from None
    return value


def check_thread(thread: Thread) -> Thread:
    """Refuse threads whose channel is not a safe directory name or whose chat id is empty."""
    try:
        channel, chat_id = thread
    except (TypeError, ValueError):
        raise ValueError(f"expected a Thread(channel, chat_id), not {thread!r}") from None
    if not isinstance(channel, str) or not CHANNEL_NAME.fullmatch(channel):
        raise ValueError(
            f"channel {channel!r} is not usable as an archive directory; use lower-case "
            "letters, digits, '-' or '_' (e.g. 'cli')")
    if not isinstance(chat_id, str) or not chat_id:
        raise ValueError(f"thread {channel}:{chat_id!r} has an empty chat id")
    check_unicode(chat_id, "chat id")
    return Thread(channel, chat_id)


def check_scope(thread: Thread | None, threads: Iterable[Thread] | None,
                owners: Iterable[str] | None = None) -> set[Thread] | None:
    """The threads a search asked for by THREAD and/or THREADS (their union), checked;
    None when it asked for none (everything, or OWNERS: names, never with threads)."""
    if owners is not None and (thread is not None or threads is not None or isinstance(
            owners, str) or not all(isinstance(owner, str) for owner in owners)):
        raise TypeError("owners must be a collection of owner names, given without "
                        "thread or threads")
    if thread is None and threads is None:
        return None
    if isinstance(threads, (str, Thread)):
        raise TypeError("threads must be a sequence of Thread, not one thread; "
                        "use thread= for one")
    scope = {check_thread(t) for t in (threads or ())}
    if thread is not None:
        scope.add(check_thread(thread))
    return scope


def check_extra(extra: dict[str, str]) -> dict[str, str]:
    """Refuse extra properties with names org cannot hold or the archive already uses."""
    for key, value in extra.items():
        if not EXTRA_KEY.fullmatch(key):
            raise ValueError(
                f"extra property name {key!r} must be UPPER_CASE letters, digits or '_' "
                "(e.g. SKILL, BACKEND)")
        if key in RESERVED_KEYS:
            raise ValueError(f"extra property name {key!r} is reserved by the archive; "
                             "choose another name")
        check_unicode(value, f"extra property {key}")
    return extra


def check_epoch(value: float) -> float:
    """Refuse timestamps org cannot show: not finite, before 1970 or after year 2999."""
    if not math.isfinite(value) or not 0 <= value < LATEST_EPOCH:
        raise ValueError(f"timestamp {value!r} must be epoch seconds between 0 and "
                         f"{LATEST_EPOCH:.0f} (year 3000)")
    return value


class NewMessage(BaseModel):
    """A message the kernel wants remembered (id and time are filled in on append).

    PARENT defaults to "auto" (the previous message of the same append, or the
    last complete entry of the thread's file); set it to an id to branch from
    an earlier message, or to None for a message that follows nothing.

    Validating an existing instance checks it again (`revalidate_instances`):
    the archive does so before writing, which catches one built with
    `model_construct` or whose `extra` dict was changed after it was made.
    Error messages never quote the input (it is message content).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, revalidate_instances="always",
                              hide_input_in_errors=True)

    role: Role
    text: str
    thread: Thread
    sender: str | None = None
    turn_type: TurnType = "speech"
    timestamp: float | None = None          # epoch seconds; None = now
    extra: dict[str, str] = Field(default_factory=dict)
    # "auto": the previous message of this append, else the file's last complete entry;
    # None: no parent; an id: that message, which must already be in the same thread.
    parent: str | None | Literal["auto"] = "auto"

    @field_validator("parent")
    @classmethod
    def _parent_ok(cls, value: str | None) -> str | None:
        if value is None or value == "auto":
            return value
        if value.split() != [value]:
            raise ValueError(f"parent {value!r} must be a message id (one word), \"auto\" or None")
        return check_unicode(value, "parent")

    @field_validator("text")
    @classmethod
    def _text_unicode(cls, value: str) -> str:
        return check_unicode(value, "text")

    @field_validator("sender")
    @classmethod
    def _sender_unicode(cls, value: str | None) -> str | None:
        return value if value is None else check_unicode(value, "sender")

    @field_validator("thread")
    @classmethod
    def _thread_ok(cls, value: Thread) -> Thread:
        return check_thread(value)

    @field_validator("timestamp")
    @classmethod
    def _timestamp_ok(cls, value: float | None) -> float | None:
        return value if value is None else check_epoch(value)

    @field_validator("extra")
    @classmethod
    def _extra_ok(cls, value: dict[str, str]) -> dict[str, str]:
        return check_extra(value)


class MessageRecord(BaseModel):
    """A message as the archive stored it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    role: Role
    text: str
    channel: str
    chat_id: str
    sender: str | None = None
    timestamp: float                         # exact epoch seconds
    parent: str | None = None                # id of the previous message of this thread
    turn_type: TurnType = "speech"
    extra: dict[str, str] = Field(default_factory=dict)

    @property
    def thread(self) -> Thread:
        return Thread(self.channel, self.chat_id)


class SearchHit(MessageRecord):
    """A record found by full-text search; a higher score means a better match."""

    score: float
    snippet: str
    matched: list[str] = Field(default_factory=list)   # the words it matched (lower case)

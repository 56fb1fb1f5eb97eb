"""Typed events that enter the kernel.

The first (and for now only) kind is a chat message.  A thread is the pair
(channel, chat id): every message of one conversation shares it, and no two
conversations do.  A topic of a bridge chat (a Telegram forum topic) is a
conversation of its own, "CHAT#TOPIC" (see `topic_chat_id`), and counts as
its chat wherever the kernel asks who is talking (`Thread.chat`).
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opencortex.problems import describe

CHANNELS: tuple[str, ...] = ("emacs", "cli", "telegram", "signal", "matrix")
Channel = Literal["emacs", "cli", "telegram", "signal", "matrix"]
TEXT_LABEL = "the message text"
MAX_DISPLAY_NAME = 256          # characters of a sender's display name kept
MAX_QUEUED = timedelta(days=30)  # a platform's send time older than this is not believed
TOPIC_MARK = "#"                # between a chat's id and its topic's in a thread's chat id
# A topic's chat id: both numbers (a Matrix room or Signal group id never reads so).
_TOPIC_CHAT_ID = re.compile(r"(-?[0-9]{1,20})#[0-9]{1,20}")


def display_name(value: str) -> str | None:
    """VALUE, a display name anyone may choose, on one line without control or format
    characters (lone surrogates included), cut to MAX_DISPLAY_NAME characters; None
    when nothing is left.  A long or odd name is cleaned, never refused."""
    value = value[:16 * MAX_DISPLAY_NAME]        # what cleaning could still keep
    name = " ".join("".join(" " if unicodedata.category(c)[0] == "C" else c
                            for c in value).split())
    return name[:MAX_DISPLAY_NAME].rstrip() or None


def platform_time(seconds: Any) -> datetime | None:
    """SECONDS since the epoch (a platform's time of a message) as an aware datetime;
    None when it is not a finite number a datetime can hold."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(seconds, timezone.utc)
    except (OverflowError, OSError, ValueError):        # inf, NaN, beyond year 9999
        return None


class EventError(ValueError):
    """An event was refused; the message says which field and why."""


class Thread(NamedTuple):
    """One conversation: a channel and the chat id within it."""

    channel: str
    chat_id: str

    def __str__(self) -> str:
        return f"{self.channel}:{self.chat_id}"

    @property
    def chat(self) -> "Thread":
        """The chat this thread is a conversation of: for a topic ("telegram:-100123#45",
        see `topic_chat_id`) that chat ("telegram:-100123"), else the thread itself.
        Who writes in a topic is who writes in its chat: the configuration that names
        a chat (its owner, its archetype) names its topics."""
        chat_id = chat_of(self.chat_id)
        return self if chat_id == self.chat_id else Thread(self.channel, chat_id)

    @property
    def config_names(self) -> tuple[str, ...]:
        """The names configuration may give this thread by, most specific first:
        "channel:chat-id", then, for a topic, its chat's (see `chat`)."""
        chat = self.chat
        return (str(self),) if chat is self else (str(self), str(chat))

    @classmethod
    def parse(cls, text: str, default_channel: str = "cli") -> "Thread":
        """Read `channel:chat-id` (or a bare chat id on DEFAULT_CHANNEL)."""
        channel, sep, chat_id = text.partition(":")
        if not sep:
            channel, chat_id = default_channel, text
        if channel not in CHANNELS:
            raise EventError(
                f"unknown channel {channel!r} in thread {text!r}; "
                f"expected one of {', '.join(CHANNELS)}")
        if not chat_id.strip():
            raise EventError(f"thread {text!r} has an empty chat id")
        return cls(channel, chat_id)


def chat_of(chat_id: str) -> str:
    """The id of the chat CHAT_ID is a conversation of: for a topic's ("-100123#45", see
    `topic_chat_id`) its chat's ("-100123"), else CHAT_ID itself."""
    if TOPIC_MARK not in chat_id:
        return chat_id
    topic = _TOPIC_CHAT_ID.fullmatch(chat_id)
    return chat_id if topic is None else topic.group(1)


def topic_chat_id(chat_id: str, topic: str) -> str:
    """The chat id of the conversation in TOPIC of the chat CHAT_ID (both numbers, as a
    platform numbers them; "" TOPIC: the chat's own conversation)."""
    if not topic:
        return chat_id
    joined = f"{chat_id}{TOPIC_MARK}{topic}"
    if _TOPIC_CHAT_ID.fullmatch(joined) is None:
        raise ValueError(f"a topic and its chat are numbered: {joined!r}")
    return joined


def _now() -> datetime:
    return datetime.now(timezone.utc)


class ChatMessage(BaseModel):
    """A message a person sent on a channel."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["chat-message"] = "chat-message"
    text: str
    channel: Channel
    chat_id: str = Field(min_length=1, max_length=512)
    sender: str | None = Field(default=None, max_length=512)
    sender_name: str | None = Field(default=None,                 # display only, see below
                                    max_length=MAX_DISPLAY_NAME)
    message_id: str | None = Field(default=None, max_length=256)  # the platform's, if any
    received_at: datetime = Field(default_factory=_now)
    sent_at: datetime | None = None     # when sent, as the platform says (see said_at)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value:
            raise ValueError(f"{TEXT_LABEL} is empty; type some text")
        if not value.strip():
            raise ValueError(f"{TEXT_LABEL} is blank; type some text")
        return value

    @field_validator("chat_id")
    @classmethod
    def _one_line_id(cls, value: str) -> str:
        if not value.strip() or any(c in value for c in "\r\n\0"):
            raise ValueError("chat_id must be a non-blank single line")
        return value

    @field_validator("sender_name", mode="before")
    @classmethod
    def _one_line_name(cls, value: Any) -> Any:
        """The sender's display name (a bridge's; anyone may choose theirs, so it is
        never used for access: recall uses it to know who a question names), as
        `display_name` cleans it."""
        return display_name(value) if isinstance(value, str) else value   # else refused

    @field_validator("received_at", "sent_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is None or value.tzinfo:
            return value
        return value.replace(tzinfo=timezone.utc)

    @property
    def said_at(self) -> datetime:
        """When the person said it: the platform's send time (a message that waited
        while the kernel was down is dated when it was sent), unless that is after it
        was received or more than MAX_QUEUED before (a sender's client or homeserver
        sets it on Signal and Matrix, so it is believed within those bounds only);
        else when it was received."""
        sent, received = self.sent_at, self.received_at
        if sent is None:
            return received
        sent = sent if sent.tzinfo else sent.replace(tzinfo=timezone.utc)
        return sent if received - MAX_QUEUED <= sent <= received else received

    @property
    def thread(self) -> Thread:
        return Thread(self.channel, self.chat_id)


Event = ChatMessage


def _describe(error: ValidationError) -> str:
    """ERROR in a person's words; problems with the text alone need no preamble."""
    problems = "; ".join(describe(error, labels={"text": TEXT_LABEL}))
    if all(item["loc"][:1] == ("text",) for item in error.errors()):
        return problems
    return f"invalid chat message: {problems}"


def parse_event(data: Any) -> Event:
    """Build an event from untrusted DATA (a mapping), or raise EventError."""
    if isinstance(data, Event):
        return data
    if not isinstance(data, dict):
        raise EventError(f"an event must be a mapping, not {type(data).__name__}")
    fields = dict(data)
    kind = fields.setdefault("kind", "chat-message")
    if kind != "chat-message":
        raise EventError(f"unknown event kind {kind!r}; expected 'chat-message'")
    if isinstance(fields.get("received_at"), (int, float)) and not isinstance(
            fields.get("received_at"), bool):
        fields["received_at"] = datetime.fromtimestamp(fields["received_at"], timezone.utc)
    try:
        return ChatMessage.model_validate(fields)
    except ValidationError as error:
        raise EventError(_describe(error)) from None


def chat_message(text: str, channel: str = "cli", chat_id: str = "local",
                 sender: str | None = None, sender_name: str | None = None) -> Event:
    """Convenience constructor that refuses bad input with EventError."""
    return parse_event({"text": text, "channel": channel, "chat_id": chat_id,
                        "sender": sender, "sender_name": sender_name})

"""What a platform hands the bridge: one incoming message, in platform-neutral terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from opencortex.events import TOPIC_MARK, topic_chat_id

Kind = Literal["text", "media", "edit", "deletion", "other"]


@dataclass(frozen=True)
class Inbound:
    """One message as the platform delivered it.

    `position` is the platform's delivery position (a Telegram update id, a
    Matrix sync batch): the bridge acknowledges it only once the message is
    handled.  `message_id` identifies the message within its chat, so a
    redelivered message is recognised.  `text` is the message text or a
    media caption ("" when there is none).  `topic` names the topic of the chat it
    was written in, when the chat has topics (a Telegram forum's): each topic is a
    conversation of its own (`conversation`), while who may talk is decided by the
    chat."""

    position: int
    chat_id: str
    sender_id: str
    message_id: str
    text: str = ""
    kind: Kind = "text"
    is_group: bool = False
    addressed_to_bot: bool = False   # in a group: it mentions the bot or replies to it
    sender_name: str = ""            # for display only; never used for access
    # Other ids the platform knows the same sender by, as it vouches for them (Signal:
    # the phone number beside the UUID); the gate lets the sender in when the allow
    # list names one of them (see `access.Gate`).
    sender_aliases: tuple[str, ...] = ()
    # When the platform says it was sent (epoch seconds; None: it says nothing).  The
    # kernel dates the message by it within bounds (see `events.ChatMessage.said_at`).
    sent_at: float | None = None
    topic: str = ""                  # the platform's number of the chat's topic, if any

    def __post_init__(self) -> None:
        topic_chat_id(self.chat_id, self.topic)   # ValueError unless both are numbers
        if type(self.sender_aliases) is not tuple:     # as read back from the inbox (JSON)
            object.__setattr__(self, "sender_aliases", tuple(self.sender_aliases))

    @property
    def conversation(self) -> str:
        """The kernel's chat id for this message's conversation: the chat's, or its
        topic's ("CHAT#TOPIC"); what the bridge answers to (see `split_conversation`)."""
        return topic_chat_id(self.chat_id, self.topic)


def split_conversation(conversation: str) -> tuple[str, str]:
    """The chat id and the topic ("" for none) of a CONVERSATION, for a platform sending
    to it (the inverse of `Inbound.conversation` for a chat whose ids hold no mark)."""
    chat_id, _, topic = conversation.partition(TOPIC_MARK)
    return chat_id, topic


def from_milliseconds(stamp: Any) -> float | None:
    """A platform's time in milliseconds since the epoch (Signal's, Matrix's) as
    seconds, for `Inbound.sent_at`; None when STAMP is no whole number, or none JSON
    carries exactly (a sender's server may write any number: 10**400 overflowed)."""
    if isinstance(stamp, bool) or not isinstance(stamp, int) or abs(stamp) > 2 ** 53:
        return None
    return stamp / 1000

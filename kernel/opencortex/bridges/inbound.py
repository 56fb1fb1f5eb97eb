"""What a platform hands the bridge: one incoming message, in platform-neutral terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["text", "media", "edit", "deletion", "other"]


@dataclass(frozen=True)
class Inbound:
    """One message as the platform delivered it.

    `position` is the platform's delivery position (a Telegram update id, a
    Matrix sync batch): the bridge acknowledges it only once the message is
    handled.  `message_id` identifies the message within its chat, so a
    redelivered message is recognised.  `text` is the message text or a
    media caption ("" when there is none)."""

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


def from_milliseconds(stamp: Any) -> float | None:
    """A platform's time in milliseconds since the epoch (Signal's, Matrix's) as
    seconds, for `Inbound.sent_at`; None when STAMP is no whole number, or none JSON
    carries exactly (a sender's server may write any number: 10**400 overflowed)."""
    if isinstance(stamp, bool) or not isinstance(stamp, int) or abs(stamp) > 2 ** 53:
        return None
    return stamp / 1000

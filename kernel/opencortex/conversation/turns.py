"""A turn: a user's message and everything after it up to the next user message.

Messages before the first user message of a branch form turn 1 on their own.
`ThreadLog` cuts a branch into turns; this is what it hands out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opencortex.memory import MessageRecord

# Extra properties the kernel writes on a turn's reply record.
TOKENS_IN, TOKENS_OUT = "TOKENS_IN", "TOKENS_OUT"


def record_tokens(record: MessageRecord) -> int:
    """TOKENS_IN + TOKENS_OUT written on RECORD (missing or unreadable counts are 0)."""
    return _count(record.extra.get(TOKENS_IN)) + _count(record.extra.get(TOKENS_OUT))


def _count(value: str | None) -> int:
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class Turn:
    """One turn of a branch: the user's message and what followed it."""

    number: int                                  # 1-based, on the branch it was read from
    user: MessageRecord | None                   # None only for messages before any user message
    replies: list[MessageRecord] = field(default_factory=list)

    @property
    def records(self) -> list[MessageRecord]:
        """The turn's messages in order."""
        return ([self.user] if self.user is not None else []) + list(self.replies)

    @property
    def ids(self) -> list[str]:
        """The ids of the turn's messages in order."""
        return [record.id for record in self.records]

    @property
    def last(self) -> str:
        """The id of the turn's last message (where a rewind to this turn puts the head)."""
        return self.ids[-1]

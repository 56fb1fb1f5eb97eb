"""Rows of the index's `messages` table: the columns read, and how a row becomes a record."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

CONTROL_KEY = "CONTROL"     # extra property marking a control record (never searchable)
SENDER_NAME = "SENDER_NAME"     # extra property: the sender's display name (a bridge's)
PLATFORM_ID = "PLATFORM_ID"     # extra property: the platform's id of a person's message
COLUMNS = "id, role, text, channel, chat_id, sender, epoch, parent, turn_type, extra"
NOT_CONTROL = f"json_extract(extra, '$.{CONTROL_KEY}') IS NULL"   # SQL: not a control record
# who sent a message, as the index searches it: the sender and their display name
WHO = f"trim(coalesce(sender, '') || ' ' || coalesce(json_extract(extra, '$.{SENDER_NAME}'), ''))"


def columns_of(alias: str) -> str:
    """COLUMNS as read from the table named ALIAS in a query ("m" -> "m.id, m.role, ...")."""
    return ", ".join(f"{alias}.{name.strip()}" for name in COLUMNS.split(","))


def who(sender: str | None, extra: Mapping[str, str]) -> str:
    """Who sent a message, as the index searches it (see WHO): "12345 Alice Smith"."""
    return " ".join(part for part in (sender, extra.get(SENDER_NAME)) if part)


def text_key(text: str) -> str:
    """TEXT bar case and spacing: a text repeated word for word has one key."""
    return " ".join(text.casefold().split())


def is_control(extra: Mapping[str, str]) -> bool:
    """True for a control record (branch/head/pin bookkeeping, not conversation)."""
    return CONTROL_KEY in extra


def row_values(record) -> tuple:
    """A MessageRecord's COLUMNS as a `messages` row holds them."""
    return (record.id, record.role, record.text, record.channel, record.chat_id,
            record.sender, record.timestamp, record.parent, record.turn_type,
            json.dumps(record.extra, sort_keys=True))


def record_fields(row: Sequence) -> dict:
    """The MessageRecord fields of a `messages` row selected as COLUMNS (first)."""
    (id_, role, text, channel, chat_id, sender, epoch, parent, turn_type, extra) = row[:10]
    return dict(id=id_, role=role, text=text, channel=channel, chat_id=chat_id,
                sender=sender, timestamp=epoch, parent=parent, turn_type=turn_type,
                extra=json.loads(extra))

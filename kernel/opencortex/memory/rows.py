"""Rows of the index's `messages` table: the columns read, how a row becomes a record,
and the queries of a message's neighbours."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

CONTROL_KEY = "CONTROL"     # extra property marking a control record (never searchable)
SENDER_NAME = "SENDER_NAME"     # extra property: the sender's display name (a bridge's)
PLATFORM_ID = "PLATFORM_ID"     # extra property: the platform's id of a person's message
IMPORTED = "IMPORTED"           # extra property: the format `memory import` read it from
DELIVERY = "DELIVERY"   # extra property: "failed" on a reply the person never got, or on
FAILED = "failed"       # the control record that follows it (see conversation.delivery)
COLUMNS = "id, role, text, channel, chat_id, sender, epoch, parent, turn_type, extra"
NOT_CONTROL = f"json_extract(extra, '$.{CONTROL_KEY}') IS NULL"   # SQL: not a control record
# who sent a message, as the index searches it: the sender and their display name
MAX_WHO_SHOWN = 60
_BRACKETS = str.maketrans("[]", "  ")
WHO = f"trim(coalesce(sender, '') || ' ' || coalesce(json_extract(extra, '$.{SENDER_NAME}'), ''))"


def columns_of(alias: str) -> str:
    """COLUMNS as read from the table named ALIAS in a query ("m" -> "m.id, m.role, ...")."""
    return ", ".join(f"{alias}.{name.strip()}" for name in COLUMNS.split(","))


def who(sender: str | None, extra: Mapping[str, str]) -> str:
    """Who sent a message, as the index searches it (see WHO): "12345 Alice Smith"."""
    return " ".join(part for part in (sender, extra.get(SENDER_NAME)) if part)


def shown_who(sender: str | None, extra: Mapping[str, str]) -> str:
    """`who` sent a message as a header shows it: one line of at most MAX_WHO_SHOWN
    characters without brackets (a display name is anyone's choice: it cannot close
    the header it stands in)."""
    return " ".join(who(sender, extra).translate(_BRACKETS).split())[:MAX_WHO_SHOWN]


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


def _nearest(sign: str, order: str) -> str:
    """SQL for the seq of the conversation message nearest to message h, on the SIGN side."""
    return (f"(SELECT n.seq FROM messages n WHERE n.channel = h.channel AND "
            f"n.chat_id = h.chat_id AND n.offset {sign} h.offset AND {NOT_CONTROL} "
            f"ORDER BY n.offset {order} LIMIT 1)")


# BEFORE_EACH: each indexed message of a JSON list of ids (?1) with the conversation message
# before it in its thread's file (NULLs when there is none, or when ?2, a JSON list, is
# given and its text holds none of them).  AFTER_EACH: each that has a message after
# it, with that message.
# (Simple joins: one query with both neighbours and a CASE over the ids cost eight
# times as much.)
BEFORE_EACH = (f"SELECT h.id, {columns_of('m')} FROM messages h LEFT JOIN messages m "
               f"ON m.seq = {_nearest('<', 'DESC')} AND (?2 IS NULL OR EXISTS (SELECT 1 FROM "
               f"json_each(?2) WHERE instr(m.text, value) > 0)) "
               f"WHERE h.id IN (SELECT value FROM json_each(?1))")
AFTER_EACH = (f"SELECT h.id, {columns_of('m')} FROM messages h "
              f"JOIN messages m ON m.seq = {_nearest('>', 'ASC')} "
              f"WHERE h.id IN (SELECT value FROM json_each(?1))")

# UNDELIVERED: those of a JSON list of ids (?1) the person never got (conversation
# messages, never a control record): carrying DELIVERY "failed" themselves, or followed
# at once in their thread's file by a control record saying so of them (one index
# lookup each, whatever the length of the thread).
UNDELIVERED = (f"SELECT h.id FROM messages h WHERE h.id IN (SELECT value FROM json_each(?1)) "
               f"AND json_extract(h.extra, '$.{CONTROL_KEY}') IS NULL "
               f"AND (json_extract(h.extra, '$.{DELIVERY}') = '{FAILED}' OR EXISTS ("
               f"SELECT 1 FROM messages m WHERE m.seq = (SELECT n.seq FROM messages n "
               f"WHERE n.channel = h.channel AND n.chat_id = h.chat_id AND n.offset > h.offset "
               f"ORDER BY n.offset ASC LIMIT 1) AND json_extract(m.extra, '$.{DELIVERY}') = "
               f"'{FAILED}' AND json_extract(m.extra, '$.TARGET') = h.id "
               f"AND json_extract(m.extra, '$.{CONTROL_KEY}') IS NOT NULL))")

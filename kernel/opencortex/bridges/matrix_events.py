"""Reading one Matrix room event (its JSON, decrypted) in the bridge's terms.

`read_event` turns the event into a `RoomEvent`: what kind of message it is
(text, media, an edit, a deletion, a reaction, or something the bridge does not
answer), its text without the quoted fallback of a reply, the thread it was
posted in, the event it replies to or reacts to, and whom it mentions.
`reaction_answer` reads an approval reaction (✅ approves, ❌ denies).
Pure functions: no I/O, no policy.

The content is whatever the sender's client put there: Synapse checks the
fields of a plain message its own users send, not those of an encrypted one
or of an event from another server.  So every field is read as the type the
spec gives it or not at all: any JSON object gives a RoomEvent or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

APPROVE = frozenset({"✅", "✔", "☑"})
DENY = frozenset({"❌", "✖", "❎"})
MEDIA = frozenset({"m.image", "m.file", "m.audio", "m.video", "m.location"})
TEXT = frozenset({"m.text", "m.emote"})


@dataclass(frozen=True)
class RoomEvent:
    """What the bridge needs from one room event."""

    event_id: str
    sender: str
    kind: str                 # an Inbound kind ("text", "media", …) or "reaction"
    text: str = ""
    thread_root: str = ""     # the thread it was posted in ("" on the main timeline)
    reply_to: str = ""        # the event it replies to
    reacts_to: str = ""       # for a reaction: the event it annotates
    reaction: str = ""        # for a reaction: its key
    mentions: tuple[str, ...] = ()


def read_event(source: dict[str, Any]) -> RoomEvent | None:
    """SOURCE (an event's JSON) as a RoomEvent; None for state and other non-messages."""
    kind = source.get("type")
    content = source.get("content")
    event_id, sender = source.get("event_id"), source.get("sender")
    if not isinstance(content, dict) or not isinstance(event_id, str) or \
            not isinstance(sender, str):
        return None
    if "state_key" in source:
        return None
    relation = content.get("m.relates_to")
    relation = relation if isinstance(relation, dict) else {}
    if kind == "m.reaction":
        return _reaction(event_id, sender, relation)
    if kind == "m.room.redaction":
        return RoomEvent(event_id, sender, "deletion")
    if kind == "m.sticker":
        return RoomEvent(event_id, sender, "media", **_place(relation))
    if kind != "m.room.message":
        return None
    return _message(event_id, sender, content, relation)


def _reaction(event_id: str, sender: str, relation: dict[str, Any]) -> RoomEvent | None:
    if relation.get("rel_type") != "m.annotation" or not isinstance(relation.get("event_id"),
                                                                      str):
        return None
    return RoomEvent(event_id, sender, "reaction", reacts_to=relation["event_id"],
                     reaction=_text(relation.get("key")))


def _message(event_id: str, sender: str, content: dict[str, Any],
             relation: dict[str, Any]) -> RoomEvent:
    msgtype = _text(content.get("msgtype"))
    body = _text(content.get("body"))
    place = _place(relation)
    mentions = _mentions(content)
    if relation.get("rel_type") == "m.replace":
        return RoomEvent(event_id, sender, "edit", **place)
    if msgtype in TEXT:
        text = strip_reply_fallback(body) if place["reply_to"] else body
        return RoomEvent(event_id, sender, "text", text=text, mentions=mentions, **place)
    if msgtype in MEDIA:
        filename = content.get("filename")
        caption = body if isinstance(filename, str) and filename and filename != body else ""
        return RoomEvent(event_id, sender, "media", text=caption, mentions=mentions, **place)
    return RoomEvent(event_id, sender, "other", **place)   # m.notice (bots), unknown types


def _text(value: Any) -> str:
    """VALUE when it is text, else ""."""
    return value if isinstance(value, str) else ""


def nested(value: Any, *keys: str) -> Any:
    """VALUE[KEYS[0]][KEYS[1]]...; None where a step is not an object or lacks the key."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _place(relation: dict[str, Any]) -> dict[str, str]:
    """The thread root and the replied-to event of a message's relation."""
    root = relation.get("event_id") if relation.get("rel_type") == "m.thread" else ""
    reply_to = nested(relation, "m.in_reply_to", "event_id")
    if relation.get("is_falling_back"):   # a thread's fallback reply is no real reply
        reply_to = ""
    return {"thread_root": _text(root), "reply_to": _text(reply_to)}


def thread_root(source: Any) -> str:
    """The thread root of the event SOURCE (any JSON: a homeserver's answer) when it is
    in a thread, else "" (kept in the clear in an encrypted event too)."""
    relation = nested(source, "content", "m.relates_to")
    return _place(relation)["thread_root"] if isinstance(relation, dict) else ""


def _mentions(content: dict[str, Any]) -> tuple[str, ...]:
    users = nested(content, "m.mentions", "user_ids")
    return tuple(user for user in users if isinstance(user, str)) \
        if isinstance(users, list) else ()


def strip_reply_fallback(body: str) -> str:
    """BODY without the quoted lines (`> …`) a client puts before a reply's own text."""
    lines = body.split("\n")
    index = 0
    while index < len(lines) and lines[index].startswith(">"):
        index += 1
    if index == 0:
        return body
    while index < len(lines) and not lines[index].strip():
        index += 1
    return "\n".join(lines[index:])


def reaction_answer(key: str) -> bool | None:
    """True for an approving reaction (✅), False for a denying one (❌), else None."""
    key = key.replace("\ufe0f", "").strip()
    if key in APPROVE:
        return True
    if key in DENY:
        return False
    return None

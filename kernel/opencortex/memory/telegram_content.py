"""What one message of a Telegram Desktop export says, as text to archive.

The text (a string, or a list of strings and {type, text} entity objects) with
a note in front for what else the message holds, as Telegram Desktop writes it
(`export_output_json.cpp`): media ("[photo]", "[sticker 👍]", "[voice message]"),
a poll ("[poll: Lunch? — Yes, No]"), a to-do list, a shared contact ("[contact:
Ann Lee]", never the phone number), a location or venue ("[location]",
"[location: Café Zeit, Hauptstr. 1]", "[live location]"), a game, an invoice,
and dice ("[dice 🎲 4]"; Telegram Desktop itself leaves dice out so far).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opencortex.memory.importer import BadMessage

MAX_NOTE_ITEMS = 20          # answers of a poll (or items of a list) named in its note
MAX_NOTE_CHARS = 200         # characters of one name or answer in a note


def message_text(data: dict[str, Any]) -> str:
    """The text of an exported message: its pieces joined, after a note of what else it holds."""
    body = _body(data, links=True)
    note = content_note(data)
    return f"{note} {body}" if note and body else note or body


def received_text(data: dict[str, Any]) -> str:
    """The text of an exported message as a bot received it (and the Telegram bridge
    archived it): the pieces' own text, a caption alone, no note and no link address."""
    return _body(data, links=False)


def _body(data: dict[str, Any], *, links: bool) -> str:
    """The text pieces of DATA joined (with LINKS, each hidden link's address after it)."""
    value = data.get("text", data.get("text_entities", ""))
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_piece(piece, links) for piece in value)
    raise BadMessage("text must be text or a list of text pieces")


def _piece(piece: Any, links: bool = True) -> str:
    """One piece of a text list: a string, or an entity object's text (with its link,
    unless not LINKS)."""
    if isinstance(piece, str):
        return piece
    if not isinstance(piece, dict) or not isinstance(piece.get("text"), str):
        raise BadMessage("a text piece is neither text nor a {type, text} object")
    href = piece.get("href")
    if links and piece.get("type") == "text_link" and isinstance(href, str) and \
            href != piece["text"]:
        return f"{piece['text']} ({href})"
    return piece["text"]


def _plain(value: Any) -> str:
    """VALUE (text, or a list of text pieces, as a poll's question) as one short line;
    "" when it is neither."""
    if isinstance(value, list):
        try:
            value = "".join(_piece(piece) for piece in value)
        except BadMessage:
            return ""
    return " ".join(value.split())[:MAX_NOTE_CHARS] if isinstance(value, str) else ""


def content_note(data: dict[str, Any]) -> str:
    """"[photo]", "[poll: …]", "[contact: …]", … for a message holding more than text,
    else ""."""
    for note in _NOTES:
        found = note(data)
        if found:
            return found
    return ""


def _media(data: dict[str, Any]) -> str:
    """A file of a kind ("[sticker 🦓]", "[voice message]"), a photo or another file."""
    kind = data.get("media_type")
    if isinstance(kind, str) and kind:
        emoji = data.get("sticker_emoji")
        shown = kind.replace("_", " ")[:40]
        return f"[{shown} {emoji[:8]}]" if isinstance(emoji, str) and emoji else f"[{shown}]"
    if "photo" in data:
        return "[photo]"
    if "file" in data:
        return "[file]"
    return ""


def _listed(what: str, title: Any, items: Any) -> str:
    """"[WHAT: TITLE — item, item]" for a poll's answers or a to-do list's items."""
    names = [_plain(item.get("text")) for item in items[:MAX_NOTE_ITEMS]
             if isinstance(item, dict)] if isinstance(items, list) else []
    names = [name for name in names if name]
    more = ", …" if isinstance(items, list) and len(items) > MAX_NOTE_ITEMS else ""
    listed = f" — {', '.join(names)}{more}" if names else ""
    heading = _plain(title)
    return f"[{what}: {heading}{listed}]" if heading else f"[{what}{listed}]"


def _poll(data: dict[str, Any]) -> str:
    poll = data.get("poll")
    if not isinstance(poll, dict):
        return ""
    return _listed("poll", poll.get("question"), poll.get("answers"))


def _todo(data: dict[str, Any]) -> str:
    todo = data.get("todo_list")
    if not isinstance(todo, dict):
        return ""
    return _listed("to-do list", todo.get("title"), todo.get("answers", todo.get("items")))


def _contact(data: dict[str, Any]) -> str:
    """A shared contact by name: the phone number is left out of memory."""
    contact = data.get("contact_information")
    if not isinstance(contact, dict):
        return ""
    name = " ".join(part for part in (_plain(contact.get("first_name")),
                                      _plain(contact.get("last_name"))) if part)
    return f"[contact: {name}]" if name else "[contact]"


def _place(data: dict[str, Any]) -> str:
    """A venue by its name and address, or a location (its coordinates left out)."""
    place = ", ".join(part for part in (_plain(data.get("place_name")),
                                        _plain(data.get("address"))) if part)
    if place:
        return f"[location: {place}]"
    if "live_location_period_seconds" in data:
        return "[live location]"
    return "[location]" if "location_information" in data else ""


def _dice(data: dict[str, Any]) -> str:
    dice = data.get("dice")
    if not isinstance(dice, dict):
        return ""
    emoji, value = _plain(dice.get("emoji"))[:8], dice.get("value")
    number = str(value) if isinstance(value, int) and not isinstance(value, bool) else ""
    shown = " ".join(part for part in (emoji, number) if part)
    return f"[dice {shown}]" if shown else "[dice]"


def _titled(key: str, what: str) -> Callable[[dict[str, Any]], str]:
    """A note "[WHAT: title]" for a message whose KEY holds a title (or an object with one)."""
    def note(data: dict[str, Any]) -> str:
        value = data.get(key)
        title = _plain(value.get("title") if isinstance(value, dict) else value)
        return "" if value is None else f"[{what}: {title}]" if title else f"[{what}]"
    return note


_NOTES: tuple[Callable[[dict[str, Any]], str], ...] = (
    _media, _poll, _todo, _contact, _place, _dice,
    _titled("game_title", "game"), _titled("invoice_information", "invoice"))

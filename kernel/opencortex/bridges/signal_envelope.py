"""Reading signal-cli's message envelopes: what a person sent, in signal-cli's JSON shapes.

signal-cli gives each incoming message as a `JsonMessageEnvelope`: `sourceUuid`,
`sourceNumber`, `sourceName`, timestamps, and one content part — a
`dataMessage` (`message`, `mentions`, `attachments`, `quote`, `reaction`,
`groupInfo`, `remoteDelete`, …), an `editMessage` (`targetSentTimestamp`,
`dataMessage`), or receipts, typing, sync, call and story messages, which are
not a person writing.  Offsets of mentions are UTF-16 code units.  The bot is
recognised by its own number, which signal-cli gives in mentions and quotes of
its messages.
"""

from __future__ import annotations

from typing import Any

APPROVE, DENY = {"\u2705", "\U0001F44D"}, {"\u274C", "\U0001F44E"}   # ✅ 👍 / ❌ 👎
_MODIFIERS = dict.fromkeys([0xFE0F, *range(0x1F3FB, 0x1F400)])    # variation, skin tones
MEDIA = ("attachments", "sticker", "contacts")


def data_message(envelope: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """(sender UUID, data message, "edit" or "") of ENVELOPE; None when it holds none."""
    sender = envelope.get("sourceUuid")
    data, kind = envelope.get("dataMessage"), ""
    edit = envelope.get("editMessage")
    if isinstance(edit, dict):
        data, kind = edit.get("dataMessage"), "edit"
    if not isinstance(sender, str) or not sender or not isinstance(data, dict):
        return None
    return sender, data, kind


def kind_of(data: dict[str, Any]) -> str:
    """What a data message is, in the bridge's terms (`Inbound.kind`)."""
    if data.get("remoteDelete"):
        return "deletion"
    if any(data.get(name) for name in MEDIA):
        return "media"
    return "text" if isinstance(data.get("message"), str) else "other"


def text_of(data: dict[str, Any], account: str) -> str:
    """The body, mentions of ACCOUNT removed and others shown as @UUID; else the
    attachments' captions."""
    text = data.get("message") if isinstance(data.get("message"), str) else ""
    mentions = _dicts(data.get("mentions"))
    for mention in sorted(mentions, key=lambda m: m.get("start", 0), reverse=True):
        shown = "" if _is(account, mention.get("number")) \
            else f"@{mention.get('uuid') or mention.get('number') or 'someone'}"
        text = _splice(text, mention.get("start"), mention.get("length"), shown)
    if any(_is(account, m.get("number")) for m in mentions):
        text = text.strip()          # "@bot hi" arrives as "\ufffc hi"
    if not text.strip():
        captions = [a.get("caption") for a in _dicts(data.get("attachments"))
                    if isinstance(a.get("caption"), str)]
        text = "\n".join(c for c in captions if c.strip())
    return text


def addresses(data: dict[str, Any], account: str) -> bool:
    """Whether the message mentions ACCOUNT or quotes one of its messages."""
    quote = data.get("quote") if isinstance(data.get("quote"), dict) else {}
    return _is(account, quote.get("authorNumber")) or \
        any(_is(account, m.get("number")) for m in _dicts(data.get("mentions")))


def reaction_answer(emoji: str) -> bool | None:
    """True for an approving reaction, False for a denying one, None for any other."""
    base = (emoji or "").translate(_MODIFIERS)
    return True if base in APPROVE else False if base in DENY else None


def _is(account: str, number: Any) -> bool:
    return bool(account) and number == account


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _splice(text: str, start: Any, length: Any, shown: str) -> str:
    """TEXT with the UTF-16 range START:LENGTH (a mention's) replaced by SHOWN."""
    units = text.encode("utf-16-le", "surrogatepass")
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length < 0 \
            or 2 * (start + length) > len(units):
        return text
    spliced = units[:2 * start] + shown.encode("utf-16-le") + units[2 * (start + length):]
    return spliced.decode("utf-16-le", "surrogatepass")

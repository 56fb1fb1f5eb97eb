"""Helpers shared by the archive tests: a default thread, records, messages, torn files."""

from __future__ import annotations

import uuid

import orgparse

from opencortex.events import Thread
from opencortex.memory import Archive, MessageRecord, NewMessage, decode_body, decode_value
from opencortex.memory.records import RESERVED_KEYS

LOCAL = Thread("cli", "local")


def make_record(text: str = "hi", *, thread: Thread = LOCAL, sender: str | None = None,
                extra: dict[str, str] | None = None, timestamp: float = 1795312503.123456,
                parent: str | None = None) -> MessageRecord:
    """A user message record with a fresh id, as the archive would have stored it."""
    return MessageRecord(id=str(uuid.uuid4()), role="user", text=text, channel=thread.channel,
                         chat_id=thread.chat_id, sender=sender, timestamp=timestamp,
                         parent=parent, extra=extra or {})


def orgparse_records(path_or_text, *, from_text: bool = False) -> list[MessageRecord]:
    """Decode every heading of an archive file read with plain orgparse."""
    root = orgparse.loads(path_or_text) if from_text else orgparse.load(path_or_text)
    out = []
    for node in root[1:]:
        props = {key: str(value) for key, value in node.properties.items()}
        body = node.get_body(format="raw").split("\n")
        out.append(MessageRecord(
            id=props["ID"], role=props["ROLE"], channel=props["CHANNEL"],
            chat_id=decode_value(props["CHAT_ID"]),
            text=decode_body(body, props.get("BODY_ENCODING") == "percent"),
            sender=decode_value(props["SENDER"]) if "SENDER" in props else None,
            timestamp=float(props["EPOCH"]), parent=props["PARENT"] or None,
            turn_type=props["TURN_TYPE"],
            extra={k: decode_value(v) for k, v in props.items() if k not in RESERVED_KEYS}))
    return out



def say(text: str, thread: Thread = LOCAL, role: str = "user", **fields) -> NewMessage:
    return NewMessage(role=role, text=text, thread=thread, **fields)


def entry_ends(archive: Archive, thread: Thread) -> list[int]:
    """Offsets where each complete entry of THREAD's file ends."""
    data = archive.thread_file(thread).read_bytes()
    starts = [i + 1 for i in range(len(data)) if data[i:i + 2] == b"\n*"]
    return starts[1:] + [len(data)]


def torn_files(path):
    """The `.torn-` files next to the thread file PATH, sorted."""
    return sorted(path.parent.glob(path.name + ".torn-*"))

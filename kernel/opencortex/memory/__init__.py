"""Memory: an org archive of every message (the ground truth) plus a SQLite FTS5 index."""

from opencortex.memory.archive import Archive, ArchiveError, safe_name
from opencortex.memory.orgformat import (EntryError, decode_body, decode_value, encode_body,
                                         encode_value)
from opencortex.memory.records import (MessageRecord, NewMessage, Role, SearchHit,
                                       TurnType)

__all__ = [
    "Archive", "ArchiveError", "EntryError", "MessageRecord", "NewMessage", "Role",
    "SearchHit", "TurnType", "decode_body", "decode_value", "encode_body", "encode_value",
    "safe_name",
]

"""Memory: an org archive of every message (the ground truth) plus a SQLite FTS5 index.

The names this package exports load their module on first use (PEP 562), so the
configuration, which imports `opencortex.memory.embedding_settings`, loads neither
the archive nor the index, and `opencortex serve` prints its port line sooner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opencortex.lazy import lazy_exports

if TYPE_CHECKING:
    from opencortex.memory.archive import Archive, ArchiveError
    from opencortex.memory.layout import safe_name
    from opencortex.memory.orgformat import (EntryError, decode_body, decode_value,
                                             encode_body, encode_value)
    from opencortex.memory.records import (MessageRecord, NewMessage, Role, SearchHit,
                                           TurnType)

_LAZY = {**dict.fromkeys(["Archive", "ArchiveError"], "archive"), "safe_name": "layout",
         **dict.fromkeys(["EntryError", "decode_body", "decode_value", "encode_body",
                          "encode_value"], "orgformat"),
         **dict.fromkeys(["MessageRecord", "NewMessage", "Role", "SearchHit", "TurnType"],
                         "records")}

__all__ = [
    "Archive", "ArchiveError", "EntryError", "MessageRecord", "NewMessage", "Role",
    "SearchHit", "TurnType", "decode_body", "decode_value", "encode_body", "encode_value",
    "safe_name",
]


__getattr__ = lazy_exports(__name__, _LAZY)

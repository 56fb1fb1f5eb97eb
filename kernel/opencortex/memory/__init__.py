"""Memory: an org archive of every message (the ground truth) plus a SQLite FTS5 index.

The names this package exports load their module on first use (PEP 562), so the
configuration, which imports `opencortex.memory.embedding_settings`, loads neither
the archive nor the index, and `opencortex serve` prints its port line sooner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opencortex.memory.archive import Archive, ArchiveError, safe_name
    from opencortex.memory.orgformat import (EntryError, decode_body, decode_value,
                                             encode_body, encode_value)
    from opencortex.memory.records import (MessageRecord, NewMessage, Role, SearchHit,
                                           TurnType)

_LAZY = {**dict.fromkeys(["Archive", "ArchiveError", "safe_name"], "archive"),
         **dict.fromkeys(["EntryError", "decode_body", "decode_value", "encode_body",
                          "encode_value"], "orgformat"),
         **dict.fromkeys(["MessageRecord", "NewMessage", "Role", "SearchHit", "TurnType"],
                         "records")}

__all__ = [
    "Archive", "ArchiveError", "EntryError", "MessageRecord", "NewMessage", "Role",
    "SearchHit", "TurnType", "decode_body", "decode_value", "encode_body", "encode_value",
    "safe_name",
]


def __getattr__(name: str) -> Any:
    """An exported name, from its module (loaded now if it was not yet)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value

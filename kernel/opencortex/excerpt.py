"""Short, bounded quotes of model data for messages: errors, reasons, notes.

A model reply can be as large as the size cap.  Anything quoted from it (back
to the model on a re-ask, to a person, into a verdict) stays small whatever
the input, costs time bounded by the quote's length rather than the input's,
and never raises on odd text: lone surrogates (undecodable bytes) are shown as
U+FFFD, so the result can always be encoded as UTF-8.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from opencortex.plist_syntax import SURROGATES, Keyword, Symbol
from opencortex.printer import print_string

_LARGE_INT_BITS = 256  # ints past this are described, not printed


def clip(text: str, limit: int) -> str:
    """TEXT cut to at most LIMIT characters (ending in "…" when cut), with
    lone surrogates replaced by U+FFFD."""
    if len(text) > limit:
        text = text[:max(0, limit - 1)] + "…"
    return SURROGATES.sub("\ufffd", text)


def excerpt(value: Any, limit: int = 60) -> str:
    """VALUE written as plist data, cut to LIMIT characters.  Only about LIMIT
    characters of VALUE are ever looked at, however large it is."""
    pieces: list[str] = []
    used = 0
    for piece in _pieces(value, limit):
        pieces.append(piece)
        used += len(piece)
        if used > limit:
            break
    return clip("".join(pieces), limit)


def _pieces(value: Any, limit: int) -> Iterator[str]:
    """VALUE's printed form in pieces, each at most about LIMIT characters."""
    if value is None or value is False:
        yield "nil"
    elif value is True:
        yield "t"
    elif isinstance(value, Keyword):
        yield ":" + value[:limit]
    elif isinstance(value, Symbol):
        yield value[:limit]
    elif isinstance(value, str):
        yield print_string(value[:limit + 1])
    elif isinstance(value, int):
        yield str(value) if value.bit_length() <= _LARGE_INT_BITS else "<a very large number>"
    elif isinstance(value, float):
        yield repr(value)
    elif isinstance(value, Mapping):
        yield from _mapping_pieces(value, limit)
    elif isinstance(value, (list, tuple)):
        yield "("
        for i, item in enumerate(value):
            if i:
                yield " "
            yield from _pieces(item, limit)
        yield ")"
    else:
        yield f"<{type(value).__name__}>"


def _mapping_pieces(value: Mapping[Any, Any], limit: int) -> Iterator[str]:
    """A mapping's pieces, as ``(:key value ...)``."""
    yield "("
    for i, (key, item) in enumerate(value.items()):
        name = key[:limit] if isinstance(key, str) else str(key)[:limit]
        yield (" :" if i else ":") + name + " "
        yield from _pieces(item, limit)
    yield ")"

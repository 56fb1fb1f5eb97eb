"""What a provider's stream reports, read as its protocol's types or not at all.

The SDKs build the objects of a stream without validating them: a field the
server wrote as another JSON type than the API's reaches the backend as that
type (a number where text belongs, a list where a reason belongs, a negative or
astronomical token count).  Text and reasons of the wrong type make the reply
unreadable (`Malformed`, a clear failure of the turn); a token count that is not
a whole number a reply could use is unknown, and the backend estimates it
instead, so a budget is never charged a count no reply could have; a model's
name that is not text is unknown, and the model asked for stands in.
"""

from __future__ import annotations

from typing import Any

MAX_REPORTED_TOKENS = 10**9   # more than any context or reply; beyond it a count is unknown
MAX_NAME = 200                # characters of a model's name or a stop reason


class Malformed(Exception):
    """The provider sent what its protocol does not allow (said without quoting it)."""


def tokens(value: Any) -> int | None:
    """VALUE as a count of tokens: a whole number from 0 to MAX_REPORTED_TOKENS, else None."""
    if value.__class__ is int and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    return None


def text(value: Any, what: str) -> str:
    """VALUE as a piece of the reply's text ("" for none); Malformed if it is not text."""
    if value is None:
        return ""
    if value.__class__ is not str:
        raise Malformed(f"{what} is not text")
    return value


def name(value: Any) -> str | None:
    """VALUE as a name (a model's): 1 to MAX_NAME printable characters (no line break,
    no control: it is shown in /metrics and the JSON of a turn), else None."""
    if value.__class__ is str and 0 < len(value) <= MAX_NAME and value.isprintable():
        return value
    return None


def reason(value: Any, what: str) -> str | None:
    """VALUE as the reason a reply stopped, None for none; Malformed if it is not a name
    (whether the reply is whole is then unknown)."""
    if value is None or value == "":
        return None
    if name(value) is None:
        raise Malformed(f"{what} is not a name")
    return value

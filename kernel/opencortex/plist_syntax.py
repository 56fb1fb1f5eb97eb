"""The vocabulary the plist reader and printer share: value types and atom syntax.

- `Keyword`: ``:REQUEST`` reads as Keyword("request") (names are case-insensitive);
- `Symbol`: any other bare word, case kept (``foo`` is Symbol("foo"));
- `ATOM_CHAR`: what an atom may be made of: anything but whitespace, brackets,
  string quotes, comments and the reader-syntax characters that are refused;
- `CONSTANTS`: ``t`` and ``nil`` (matched case-insensitively);
- `SURROGATES`: lone surrogates, which undecodable bytes leave in text: no
  reply holding one is read, and no text holding one is printed.
"""

from __future__ import annotations

import re

ATOM_CHAR = r"[^ \t\n\r\f\v()\[\]\";'`,#\\]"
ATOM = re.compile(ATOM_CHAR + "+")
WHITESPACE = " \t\n\r\f\v"
CONSTANTS = {"t": True, "nil": None}
SURROGATES = re.compile("[\ud800-\udfff]")


class Keyword(str):
    """A Lisp keyword value: ``:REQUEST`` is Keyword("request") (no colon)."""

    __slots__ = ()

    def __new__(cls, name: str) -> "Keyword":
        return super().__new__(cls, name.lower())

    def __repr__(self) -> str:
        return f"Keyword({str.__repr__(self)})"


class Symbol(str):
    """A bare Lisp symbol value, case kept: ``foo`` is Symbol("foo")."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


def reads_as_number(token: str) -> bool:
    """Whether the atom TOKEN is a number: int() or float() accepts it (float()
    accepts every string int() does, and more)."""
    try:
        float(token)
    except ValueError:
        return False
    return True

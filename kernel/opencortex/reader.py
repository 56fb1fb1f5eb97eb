"""Read a model's reply as data: one property list, never code.

A model reply should hold exactly one Lisp plist, e.g. ``(:type :request
:text "hi")``, maybe in a markdown fence or amid prose.  `read_reply` finds
that form, checks it and turns it into Python:

- ``(:key value ...)`` -> dict with lower-case str keys ("chat-id")
- ``:KEYWORD`` -> Keyword("keyword") (keywords are case-insensitive)
- ``t`` -> True, ``nil`` -> None, ``()`` -> [], ``"..."`` -> str
- numbers (what Python's int(), else float(), accepts) -> int / float;
  other bare symbols -> Symbol (case kept)
- any other list, and every ``[...]`` vector -> list

The form read is the first ``(`` whose first token is a keyword.  One regex
scan over its tokens builds the values as it goes (no recursion, no second
parser), so reading costs time linear in the form's size and stops at the
first problem.  The scan skips comments, enforces the depth and element caps,
and refuses reader syntax (``#`` anything, also directly before the form,
backquote, comma, quote, ``?c``, backslash outside strings, dotted pairs).
Strings decode the escapes ``\\\\ \\" \\n \\t \\r \\b \\f``; other backslash
pairs stay as written.  Text that is not valid Unicode (lone surrogates, left
by undecodable bytes) is refused.  Nothing is ever evaluated.  Every failure
is one `ReadError` whose reason says what to do, with the character offset in
the original text when known.

`print_plist` / `print_value` (`opencortex.printer`) are the inverse: for
action-shaped data ``read_plist(print_plist(x)) == x``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from opencortex.plist_syntax import ATOM_CHAR, CONSTANTS, Keyword, Symbol
from opencortex.printer import print_plist, print_value

__all__ = ["Keyword", "Reading", "ReadError", "Symbol", "print_plist", "print_value",
           "read_plist", "read_reply"]

log = logging.getLogger(__name__)

_MAX_DEPTH_LIMIT = 200  # callers may not raise the depth cap past this
_NAME_LIMIT = 40        # keyword names quoted in error messages are cut here

# One token, after optional whitespace.  Strings use possessive quantifiers so
# an unterminated string costs one linear pass; `end` consumes trailing space.
_TOKEN = re.compile(
    r"[ \t\n\r\f\v]*+(?:"
    r'(?P<string>"[^"\\]*+(?:\\.[^"\\]*+)*+")'
    r"|(?P<open>[(\[])|(?P<close>[)\]])|(?P<comment>;[^\n]*+)"
    rf"|(?P<atom>{ATOM_CHAR}++)|(?P<end>\Z)|(?P<bad>.))",
    re.DOTALL)

# Where a plist form starts: "(" then a keyword as the first token.
_PLIST_START = re.compile(r"\([ \t\n\r\f\v]*:" + ATOM_CHAR)

# '#' reader syntax glued to the form's "(" (#.(, #'(, #s(, #(): refused.
_HASH_PREFIX = re.compile(r"#[^ \t\n\r\f\v()\[\]\"]{0,2}\Z")

_CLOSER = {"(": ")", "[": "]"}
_ESCAPES = (("\\\"", '"'), ("\\n", "\n"), ("\\t", "\t"), ("\\r", "\r"),
            ("\\b", "\b"), ("\\f", "\f"))
# Besides digits (and whitespace, which int() and float() strip), a number
# starts with a sign, "." or the i/n of "inf"/"nan", and ends with "." ("1."),
# or the n/f/y of "nan", "inf", "infinity".
_NUMBER_STARTS = frozenset("+-.iInN")
_NUMBER_ENDS = frozenset(".nNfFyY")

_REFUSED = {
    '"': "unterminated string; add the closing '\"'",
    "#": "'#' reader syntax (#'f, #x10, #(...), #<...>, #.) is not allowed "
         "outside strings; write plain data or put the text in double quotes",
    "'": "quote (') is not allowed outside strings; write plain data, "
         "or put the text in double quotes",
    "`": "backquote is not allowed outside strings; write plain data",
    ",": "comma is not allowed outside strings; separate items with spaces",
    "\\": "backslash is not allowed outside strings; put the text in double quotes",
    # refused atoms, keyed by their first character
    "?": "?c character syntax is not allowed; write the character as a string",
    ".": "dotted pairs (a . b) are not supported; use a plist or a list",
    ":": "a keyword needs a name after ':'",
}


class ReadError(ValueError):
    """A reply could not be read as one plist; `reason` says what to do."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f" (at character {position})" if position is not None else ""
        super().__init__(reason + where)


@dataclass(frozen=True)
class Reading:
    """The plist found in a reply, and what was around it."""

    form: dict[str, Any]  # keys lower-case without colon
    ignored: str          # prose and fences around the form, stripped
    start: int            # span of the form in the original text
    end: int


# ---------------------------------------------------------------- reading


def read_reply(text: str, *, max_bytes: int = 1 << 20, max_depth: int = 64,
               max_elements: int = 10_000) -> Reading:
    """Find and read the one plist in TEXT (a model reply).

    Caps: MAX_BYTES of UTF-8, MAX_DEPTH levels of nesting, MAX_ELEMENTS atoms,
    strings, lists and comments in the form."""
    _check_input(text, max_bytes, max_depth, max_elements)
    start = _find_start(text)
    form, end = _build(text, start, max_depth, max_elements)
    second = _PLIST_START.search(text, end)
    if second is not None:
        raise ReadError(
            "two forms: the reply holds a second plist after the first; "
            "send exactly one", second.start())
    before, after = text[:start].strip(), text[end:].strip()
    ignored = "\n".join(part for part in (before, after) if part)
    return Reading(form=form, ignored=ignored, start=start, end=end)


def read_plist(text: str, **caps: int) -> dict[str, Any]:
    """Read the one plist in TEXT and return it as a mapping."""
    return read_reply(text, **caps).form


def _check_input(text: object, max_bytes: int, max_depth: int, max_elements: int) -> None:
    """Refuse bad caps (ValueError: a caller bug), then non-text, text over the
    size cap and text that is not valid Unicode (ReadError), before scanning."""
    if max_bytes < 0 or max_elements < 1 or not 1 <= max_depth <= _MAX_DEPTH_LIMIT:
        raise ValueError(f"need max_bytes >= 0, max_elements >= 1 and 1 <= max_depth <= "
                         f"{_MAX_DEPTH_LIMIT}, got {max_bytes}, {max_elements}, {max_depth}")
    if not isinstance(text, str):
        raise ReadError(
            f"expected the reply as text (str), got {type(text).__name__}; "
            "decode it first")
    if len(text) > max_bytes:
        _refuse_size(len(text), max_bytes)
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise ReadError(
            "the reply is not valid text: it holds an undecodable byte (a lone "
            "surrogate); send plain UTF-8 text", error.start) from None
    if size > max_bytes:
        _refuse_size(len(text), max_bytes)


def _refuse_size(characters: int, max_bytes: int) -> None:
    """Refuse a reply over the size cap."""
    log.debug("reply refused: %d characters over the %d-byte cap", characters, max_bytes)
    raise ReadError(f"reply is over the {max_bytes}-byte limit; send a shorter reply")


def _find_start(text: str) -> int:
    """Where the first plist form starts; refuse '#' syntax glued to it."""
    first = _PLIST_START.search(text)
    if first is None:
        raise ReadError(
            "no plist found; the reply must contain one form like "
            "(:type :request :text \"...\")")
    start = first.start()
    prefix = _HASH_PREFIX.search(text, max(0, start - 3), start)
    if prefix is not None:
        raise ReadError(
            "'#' reader syntax directly before the form (#.(...), #'(...)) is not "
            "allowed; send the plist alone, starting with '('", prefix.start())
    return start


class _Frame:
    """One open bracket while building: its items, or its plist when the
    first item of a '(' list is a keyword."""

    __slots__ = ("opener", "position", "items", "plist", "key", "key_position")

    def __init__(self, opener: str, position: int) -> None:
        self.opener = opener
        self.position = position
        self.items: list[Any] = []
        self.plist: dict[str, Any] | None = None
        self.key: str | None = None        # a plist key still waiting for its value
        self.key_position = position

    def add(self, value: Any, position: int) -> None:
        """Append VALUE (found at POSITION), checking the plist's shape."""
        if self.plist is None:
            if self.items or self.opener != "(" or type(value) is not Keyword:
                self.items.append(value)
                return
            self.plist = {}
        if self.key is not None:
            self.plist[self.key] = value
            self.key = None
        elif type(value) is not Keyword:
            raise ReadError(
                f"expected a keyword at element {2 * len(self.plist) + 1} of the plist, "
                f"found {_kind(value)}; a plist alternates :key value", position)
        elif value in self.plist:
            raise ReadError(f"duplicate key :{value[:_NAME_LIMIT]}; each key may "
                            "appear once", position)
        else:
            self.key, self.key_position = str(value), position

    def close(self, closer: str, position: int) -> Any:
        """The finished value: a dict for a plist, else a list."""
        if _CLOSER[self.opener] != closer:
            raise ReadError(
                f"'{closer}' closes the '{self.opener}' opened at character "
                f"{self.position}; use '{_CLOSER[self.opener]}'", position)
        if self.plist is None:
            return self.items
        if self.key is not None:
            raise ReadError(f"plist key :{self.key[:_NAME_LIMIT]} has no value; add a "
                            "value after it", self.key_position)
        return self.plist


def _build(text: str, start: int, max_depth: int,
           max_elements: int) -> tuple[dict[str, Any], int]:
    """Read the form opened at START in one pass; return it and where it ends."""
    frames: list[_Frame] = []
    left = max_elements
    for match in _TOKEN.finditer(text, start):
        kind = match.lastgroup
        position = match.start(kind)
        if kind == "close":
            value = frames.pop().close(text[position], position)
            if not frames:
                return value, position + 1
        else:
            left -= 1
            if left < 0:
                raise ReadError(
                    f"the form holds more than {max_elements} elements; send less "
                    "data, or put long text in one string", position)
            if kind == "atom":
                value = _atom(match.group(kind), position)
            elif kind == "string":
                value = _string(match.group(kind))
            elif kind == "open":
                if len(frames) == max_depth:
                    raise ReadError(
                        f"nested deeper than {max_depth} levels; flatten the data", position)
                frames.append(_Frame(text[position], position))
                continue
            elif kind == "comment":
                continue
            elif kind == "bad":
                raise _refusal(text, position, frames[-1].position)
            else:  # end of text
                break
        frames[-1].add(value, position)
    opener = frames[-1]
    raise ReadError(f"'{opener.opener}' is never closed; add the missing "
                    f"'{_CLOSER[opener.opener]}'", opener.position)


def _atom(token: str, position: int) -> Any:
    """An atom's value: Keyword, number, True/None or Symbol; refuse reader
    syntax (?c, a lone '.' or ':')."""
    first = token[0]
    if first == ":":
        if len(token) == 1:
            raise ReadError(_REFUSED[":"], position)
        return Keyword(token[1:])
    if first == "?" or token == ".":
        raise ReadError(_REFUSED[first], position)
    if _may_be_number(first, token[-1]):
        number = _number(token)
        if number is not None:
            if isinstance(number, float) and not math.isfinite(number):
                raise ReadError("number is too large or not finite (nan/inf); "
                                "write it as a string", position)
            return number
    lower = token.lower()
    return CONSTANTS[lower] if lower in CONSTANTS else Symbol(token)


def _may_be_number(first: str, last: str) -> bool:
    """Whether a token with these first and last characters could be a number
    (a cheap test that spares int()/float() on ordinary symbols)."""
    return ((first.isdigit() or first in _NUMBER_STARTS or first.isspace())
            and (last.isdigit() or last in _NUMBER_ENDS or last.isspace()))


def _number(token: str) -> int | float | None:
    """TOKEN as int(), else float(), else None."""
    try:
        return int(token)
    except ValueError:
        pass
    try:
        return float(token)
    except ValueError:
        return None


def _string(token: str) -> str:
    """A string token's text (quotes removed, escapes decoded).  Each backslash
    pairs with the next character, left to right: splitting on escaped
    backslashes first leaves pieces where every backslash starts a pair."""
    body = token[1:-1]
    if "\\" not in body:
        return body
    pieces = body.split("\\\\")
    for i, piece in enumerate(pieces):
        if "\\" in piece:
            for escape, char in _ESCAPES:
                piece = piece.replace(escape, char)
            pieces[i] = piece
    return "\\".join(pieces)


def _kind(value: Any) -> str:
    """Name the kind of a value for an error message (never its content)."""
    if isinstance(value, (Keyword, Symbol)) or value is True or value is None:
        return "a symbol"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    return "a list"


def _refusal(text: str, position: int, innermost: int) -> ReadError:
    """Explain a refused character found while scanning the form."""
    if text.startswith("```", position):
        return ReadError(
            f"the '{text[innermost]}' opened at character {innermost} is not "
            f"closed before the ``` fence; add the missing "
            f"'{_CLOSER[text[innermost]]}'", position)
    reason = _REFUSED.get(text[position], f"unexpected character {text[position]!r}")
    return ReadError(reason, position)

"""Read a model's reply as data: one property list, never code.

A model reply should hold exactly one Lisp plist, e.g. ``(:type :request
:text "hi")``, maybe in a markdown fence or amid prose.  `read_reply` finds
that form, checks it and turns it into Python:

- ``(:key value ...)`` -> dict with lower-case str keys ("chat-id")
- ``:KEYWORD`` -> Keyword("keyword") (keywords are case-insensitive)
- ``t`` -> True, ``nil`` -> None, ``()`` -> [], ``"..."`` -> str
- numbers -> int / float; other bare symbols -> Symbol (case kept)
- any other list, and every ``[...]`` vector -> list

The form read is the first ``(`` whose first token is a keyword.  One O(n)
regex scan then finds its closing ``)`` while skipping strings and comments,
enforcing the depth cap and refusing reader syntax (``#`` anything,
backquote, comma, quote, ``?c``, backslash outside strings, dotted pairs).
Only that checked span reaches sexpdata, so its quirks (asserts, Recursion-,
Attribute-, IndexError) never surface.  sexpdata decodes the string escapes
``\\\\ \\" \\n \\t \\r \\b \\f``; other backslash pairs stay as written.
Nothing is ever evaluated.  Every failure is one `ReadError` whose reason says
what to do, with the character offset in the original text when known.

`print_plist` / `print_value` are the inverse: for action-shaped data
``read_plist(print_plist(x)) == x``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import sexpdata

log = logging.getLogger(__name__)

_MAX_DEPTH_LIMIT = 200  # deeper caps would put Python recursion at risk
_NAME_LIMIT = 40        # keyword names quoted in error messages are cut here

# One atom character: anything except sexpdata's whitespace and delimiters,
# and except the reader-syntax characters we refuse.
_ATOM_CHAR = r"[^ \t\n\r\f\v()\[\]\";'`,#\\]"
_ATOM = re.compile(_ATOM_CHAR + "+")

# One token, after optional whitespace.  Strings use possessive quantifiers so
# an unterminated string costs one linear pass; `end` consumes trailing space.
_TOKEN = re.compile(
    r"[ \t\n\r\f\v]*+(?:"
    r'(?P<string>"[^"\\]*+(?:\\.[^"\\]*+)*+")'
    r"|(?P<open>[(\[])|(?P<close>[)\]])|(?P<comment>;[^\n]*+)"
    rf"|(?P<atom>{_ATOM_CHAR}++)|(?P<end>\Z)|(?P<bad>.))",
    re.DOTALL)

# Where a plist form starts: "(" then a keyword as the first token.
_PLIST_START = re.compile(r"\([ \t\n\r\f\v]*:" + _ATOM_CHAR)

_CLOSER = {"(": ")", "[": "]"}
_CONSTANTS = {"t": True, "nil": None}  # matched case-insensitively

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


@dataclass(frozen=True)
class Reading:
    """The plist found in a reply, and what was around it."""

    form: dict[str, Any]  # keys lower-case without colon
    ignored: str          # prose and fences around the form, stripped
    start: int            # span of the form in the original text
    end: int


class _FormError(Exception):
    """Internal: args are (reason, path of child indexes from the top form)."""


# ---------------------------------------------------------------- reading


def read_reply(text: str, *, max_bytes: int = 1 << 20,
               max_depth: int = 64) -> Reading:
    """Find and read the one plist in TEXT (a model reply)."""
    _check_input(text, max_bytes, max_depth)
    start, end = _find_form(text, max_depth)
    try:
        form = _value(_parse(text[start:end]), ())
    except _FormError as err:
        reason, path = err.args
        raise ReadError(reason, _locate(text, start, path)) from None
    before, after = text[:start].strip(), text[end:].strip()
    ignored = "\n".join(part for part in (before, after) if part)
    return Reading(form=form, ignored=ignored, start=start, end=end)


def read_plist(text: str, **caps: int) -> dict[str, Any]:
    """Read the one plist in TEXT and return it as a mapping."""
    return read_reply(text, **caps).form


def _check_input(text: object, max_bytes: int, max_depth: int) -> None:
    """Refuse bad caps (ValueError: a caller bug), then non-text and text
    over the size cap (ReadError), before any scanning."""
    if max_bytes < 0 or not 1 <= max_depth <= _MAX_DEPTH_LIMIT:
        raise ValueError(f"need max_bytes >= 0 and 1 <= max_depth <= "
                         f"{_MAX_DEPTH_LIMIT}, got {max_bytes}, {max_depth}")
    if not isinstance(text, str):
        raise ReadError(
            f"expected the reply as text (str), got {type(text).__name__}; "
            "decode it first")
    if len(text) * 4 <= max_bytes:
        return  # no UTF-8 encoding can exceed the cap
    size = len(text) if len(text) > max_bytes else \
        len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        log.debug("reply refused: %d characters over the %d-byte cap",
                  len(text), max_bytes)
        raise ReadError(
            f"reply is over the {max_bytes}-byte limit; send a shorter reply")


def _find_form(text: str, max_depth: int) -> tuple[int, int]:
    """Return the span of the first plist form; refuse a second one."""
    first = _PLIST_START.search(text)
    if first is None:
        raise ReadError(
            "no plist found; the reply must contain one form like "
            "(:type :request :text \"...\")")
    start = first.start()
    end = _scan_form(text, start, max_depth)
    second = _PLIST_START.search(text, end)
    if second is not None:
        raise ReadError(
            "two forms: the reply holds a second plist after the first; "
            "send exactly one", second.start())
    return start, end


def _scan_form(text: str, start: int, max_depth: int) -> int:
    """Return the end of the balanced form opened at START (one O(n) pass)."""
    opened: list[int] = []  # positions of the brackets not yet closed
    for match in _TOKEN.finditer(text, start):
        kind = match.lastgroup
        pos = match.start(kind)
        if kind == "open":
            opened.append(pos)
            if len(opened) > max_depth:
                raise ReadError(
                    f"nested deeper than {max_depth} levels; flatten the data", pos)
        elif kind == "close":
            opener = opened.pop()
            if _CLOSER[text[opener]] != text[pos]:
                raise ReadError(
                    f"'{text[pos]}' closes the '{text[opener]}' opened at "
                    f"character {opener}; use '{_CLOSER[text[opener]]}'", pos)
            if not opened:
                return pos + 1
        elif kind == "atom":
            _check_atom(match.group(kind), pos)
        elif kind == "bad":
            raise _refusal(text, pos, opened[-1])
        elif kind == "end":
            break
    raise ReadError(
        f"'{text[opened[-1]]}' is never closed; add the missing "
        f"'{_CLOSER[text[opened[-1]]]}'", opened[-1])


def _check_atom(token: str, pos: int) -> None:
    """Refuse atoms that are reader syntax rather than data (?c, ., :)."""
    if token[0] == "?" or token in (".", ":"):
        raise ReadError(_REFUSED[token[0]], pos)


def _refusal(text: str, pos: int, innermost: int) -> ReadError:
    """Explain a refused character found while scanning the form."""
    if text.startswith("```", pos):
        return ReadError(
            f"the '{text[innermost]}' opened at character {innermost} is not "
            f"closed before the ``` fence; add the missing "
            f"'{_CLOSER[text[innermost]]}'", pos)
    reason = _REFUSED.get(text[pos], f"unexpected character {text[pos]!r}")
    return ReadError(reason, pos)


def _parse(span: str) -> Any:
    """Parse one checked, balanced form with sexpdata (t/nil left as symbols)."""
    try:
        forms = sexpdata.Parser(span, nil=None, true=None).parse()
    except Exception as err:  # the scan should make this impossible
        log.warning("sexpdata failed on a checked form: %s", type(err).__name__)
        raise ReadError(f"could not read the form ({type(err).__name__})") from None
    if len(forms) != 1:
        raise ReadError("expected exactly one form")
    return forms[0]


def _value(node: Any, path: tuple[int, ...]) -> Any:
    """Turn one sexpdata node into our Python value."""
    if isinstance(node, sexpdata.Symbol):  # Symbol subclasses str: test first
        return _symbol(str(node))
    if isinstance(node, str):
        return node
    if isinstance(node, (int, float)):
        if isinstance(node, float) and not math.isfinite(node):
            raise _FormError(
                "number is too large or not finite (nan/inf); "
                "write it as a string", path)
        return node
    if isinstance(node, sexpdata.Brackets):
        return _items(node.I, path)
    if isinstance(node, list):
        if node and _is_keyword(node[0]):
            return _plist(node, path)
        return _items(node, path)
    raise _FormError(f"unsupported element ({type(node).__name__})", path)


def _symbol(name: str) -> Any:
    """Turn a symbol's text into a Keyword, True, None or Symbol."""
    if name.startswith(":"):
        return Keyword(name[1:])
    lower = name.lower()
    return _CONSTANTS[lower] if lower in _CONSTANTS else Symbol(name)


def _is_keyword(node: Any) -> bool:
    return isinstance(node, sexpdata.Symbol) and node.startswith(":")


def _items(nodes: Any, path: tuple[int, ...]) -> list[Any]:
    return [_value(node, (*path, i)) for i, node in enumerate(nodes)]


def _plist(nodes: list[Any], path: tuple[int, ...]) -> dict[str, Any]:
    """Turn ``(:k v :k2 v2 ...)`` into a dict, checking its shape."""
    form: dict[str, Any] = {}
    for i in range(0, len(nodes), 2):
        key = nodes[i]
        if not _is_keyword(key):
            raise _FormError(
                f"expected a keyword at element {i + 1} of the plist, found "
                f"{_describe(key)}; a plist alternates :key value", (*path, i))
        name = str(Keyword(key[1:]))
        shown = ":" + name[:_NAME_LIMIT]
        if i + 1 == len(nodes):
            raise _FormError(
                f"plist key {shown} has no value; add a value after it",
                (*path, i))
        if name in form:
            raise _FormError(
                f"duplicate key {shown}; each key may appear once", (*path, i))
        form[name] = _value(nodes[i + 1], (*path, i + 1))
    return form


def _describe(node: Any) -> str:
    """Name the kind of a node for an error message (never its content)."""
    for kind, name in ((sexpdata.Symbol, "a symbol"), (str, "a string"),
                       ((int, float), "a number")):
        if isinstance(node, kind):
            return name
    return "a list"


def _locate(text: str, start: int, path: tuple[int, ...]) -> int:
    """Return where the element at PATH (child indexes) starts in TEXT."""
    stack: list[list[Any]] = []  # per open list: [its path, next child index]
    for match in _TOKEN.finditer(text, start):
        kind = match.lastgroup
        if kind == "close":
            stack.pop()
            if not stack:
                break
            continue
        if kind not in ("open", "atom", "string"):
            continue
        here: tuple[int, ...] = ()
        if stack:
            here = (*stack[-1][0], stack[-1][1])
            stack[-1][1] += 1
        if here == path:
            return match.start(kind)
        if kind == "open":
            stack.append([here, 0])
    return start


# --------------------------------------------------------------- printing


def print_plist(form: Mapping[str, Any]) -> str:
    """Print FORM as ``(:key value ...)``; `read_plist` reads it back."""
    if not isinstance(form, Mapping):
        raise TypeError(f"print_plist needs a mapping, got {type(form).__name__}")
    return _print_mapping(form)


def print_value(value: Any) -> str:
    """Print one value in the syntax `read_reply` reads."""
    if value is None or value is False:
        return "nil"
    if value is True:
        return "t"
    if isinstance(value, Keyword):
        return ":" + _checked_name(value)
    if isinstance(value, Symbol):
        return _checked_symbol(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be printed; use a finite number")
        return repr(value)
    if isinstance(value, Mapping):
        return _print_mapping(value)
    if isinstance(value, (list, tuple)):
        return _print_list(value)
    raise TypeError(f"cannot print a {type(value).__name__} as plist data")


def _print_mapping(form: Mapping[str, Any]) -> str:
    """Print a non-empty mapping as a plist (an empty one would read as [])."""
    if not form:
        raise ValueError(
            "an empty mapping cannot be printed as a plist: it would read "
            "back as an empty list")
    parts: list[str] = []
    seen: set[str] = set()
    for key, value in form.items():
        if not isinstance(key, str):
            raise TypeError(f"plist keys must be str, got {type(key).__name__}")
        name = Keyword(key)
        if name in seen:
            raise ValueError(f"keys differ only by case: {key!r}; keywords "
                             "are case-insensitive")
        seen.add(name)
        parts.append(":" + _checked_name(name))
        parts.append(print_value(value))
    return "(" + " ".join(parts) + ")"


def _print_list(items: list[Any] | tuple[Any, ...]) -> str:
    """Print a list; one starting with a keyword becomes a [vector] so it
    does not read back as a plist."""
    body = " ".join(print_value(item) for item in items)
    if items and isinstance(items[0], Keyword):
        return "[" + body + "]"
    return "(" + body + ")"


def _checked_name(name: str) -> str:
    """Return NAME if it reads back as one keyword name, else refuse."""
    if not _ATOM.fullmatch(name):
        raise ValueError(
            f"{name!r} cannot be a keyword: it must be non-empty, without "
            "spaces, brackets, quotes, ';', ',', '#' or backslashes")
    return name


def _checked_symbol(name: str) -> str:
    """Return NAME if it reads back as the same bare symbol, else refuse."""
    if (not _ATOM.fullmatch(name) or name[0] in ":?" or name == "."
            or name.lower() in _CONSTANTS or _reads_as_number(name)):
        raise ValueError(
            f"{name!r} cannot be printed as a bare symbol: it would read back "
            "as something else; use a string")
    return name


def _reads_as_number(token: str) -> bool:
    """Whether sexpdata would turn TOKEN into a number.  It tries int() then
    float(); float() accepts every string int() does (and more)."""
    try:
        float(token)
    except ValueError:
        return False
    return True

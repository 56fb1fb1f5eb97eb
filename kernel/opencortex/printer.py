"""Print action-shaped data as a plist that `opencortex.reader` reads back exactly.

For data made of str keys, Keywords, Symbols, strings, ints, finite floats,
True/None, lists and non-empty mappings: ``read_plist(print_plist(x)) == x``.
What would not read back the same (an empty mapping, a keyword with a space, a
symbol that would read as a number or as ``t``, text with a lone surrogate) is
refused with ValueError.
For short, bounded quotes of any value in messages, see `opencortex.excerpt`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from opencortex.plist_syntax import (ATOM, CONSTANTS, SURROGATES, Keyword, Symbol,
                                     reads_as_number)


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
        if SURROGATES.search(value):
            raise ValueError("text with a lone surrogate (an undecodable byte) cannot be "
                             "printed: the reader refuses it")
        return print_string(value)
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


def print_string(text: str) -> str:
    """TEXT in double quotes, with backslashes and quotes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
            raise ValueError(f"keys differ only by case: {key[:40]!r}; keywords "
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
    if not ATOM.fullmatch(name):
        raise ValueError(
            f"{name[:40]!r} cannot be a keyword: it must be non-empty, without "
            "spaces, brackets, quotes, ';', ',', '#' or backslashes")
    return name


def _checked_symbol(name: str) -> str:
    """Return NAME if it reads back as the same bare symbol, else refuse."""
    if (not ATOM.fullmatch(name) or name[0] in ":?" or name == "."
            or name.lower() in CONSTANTS or reads_as_number(name)):
        raise ValueError(
            f"{name[:40]!r} cannot be printed as a bare symbol: it would read back "
            "as something else; use a string")
    return name

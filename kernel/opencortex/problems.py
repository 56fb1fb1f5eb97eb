"""Validation problems of a person's input (configuration, events) in their words.

(Problems of a model's reply, in plist terms, are `opencortex.plain_errors`'.)

Pydantic reports "text: Value error, text is blank" or "Input should be a valid
list"; people need "the message text is blank; type some text" and
"skill_dirs must be a list, not int (5)".  `describe` turns a ValidationError
into such sentences, one per problem, naming the field (or a label for it)
and, for a wrong value, what was given (shortened).  At most MAX_PROBLEMS are
described, so a huge invalid input cannot make a huge message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

MAX_PROBLEMS = 10
MAX_SHOWN = 40            # characters of a given value repeated in a message

_KINDS = {"string": "text", "str": "text", "int": "a whole number", "float": "a number",
          "bool": "true or false", "list": "a list", "dict": "a table", "model": "a table",
          "path": "a path", "datetime": "a date and time", "tuple": "a list", "set": "a list"}
_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}


def _where(loc: tuple[Any, ...], labels: Mapping[str, str]) -> str:
    """The dotted location of a problem ("chat.history_chars", "skill_dirs[0]")."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return labels.get(text, text or "the input")


def _given(value: Any) -> str:
    """VALUE as shown in a message: its repr, shortened."""
    shown = repr(value)
    return shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN - 1] + "…"


def _phrase(item: Mapping[str, Any], where: str, noun: str) -> str:
    """One problem as a sentence."""
    kind, ctx, value = item["type"], item.get("ctx") or {}, item.get("input")
    if kind == "missing":
        return f"{where} is missing"
    if kind == "extra_forbidden":
        return f"unknown {noun} {where}; check its spelling"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error") or item["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        return f"{where} must be one of {ctx.get('expected')}, not {_given(value)}"
    if kind == "string_too_short":
        least = ctx.get("min_length")
        return f"{where} is empty" if least == 1 else \
            f"{where} is too short (at least {least} characters)"
    if kind == "string_too_long":
        return f"{where} is too long (at most {ctx.get('max_length')} characters)"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{where} must be {words} {ctx.get(key)}, not {_given(value)}"
    prefix = kind.split("_")[0]
    if kind.endswith(("_type", "_parsing")) and prefix in _KINDS:
        return f"{where} must be {_KINDS[prefix]}, not {type(value).__name__} ({_given(value)})"
    message = str(item["msg"]).replace("Input should be", "should be")
    return f"{where}: {message[:1].lower()}{message[1:]}"


def describe(error: ValidationError, *, labels: Mapping[str, str] | None = None,
             noun: str = "field") -> list[str]:
    """The problems of ERROR as sentences.  LABELS names fields for people
    ({"text": "the message text"}); NOUN is what an unknown key is called."""
    items = error.errors()
    found = [_phrase(item, _where(item["loc"], labels or {}), noun)
             for item in items[:MAX_PROBLEMS]]
    if len(items) > MAX_PROBLEMS:
        found.append(f"and {len(items) - MAX_PROBLEMS} more problems")
    return found

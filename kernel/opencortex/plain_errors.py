"""Pydantic validation errors as plain sentences a model (or a person) can act on.

Each error becomes one sentence that names the plist key (``:chat-id``, with
``item N`` for a list element), says what is expected, and quotes at most a
short excerpt of the value given — never pydantic's own vocabulary ("Input
should be a valid dictionary", "Value error,", union tags such as
``function-before[...]``).  Only the first few errors are described, then
"and N more", so a reply with ten thousand bad items costs one short message.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from pydantic import ValidationError

from opencortex.excerpt import clip, excerpt

MAX_REASONS = 10   # sentences described; the rest are counted
QUOTE_LIMIT = 40   # characters of a bad value quoted back
SENTENCE_LIMIT = 300

_QUOTED = re.compile(r"'([^']*)'")

_KINDS = {
    "string_type": "a string in double quotes",
    "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "t or nil", "bool_parsing": "t or nil",
    "list_type": "a list like (a b c)", "tuple_type": "a list like (a b c)",
    "set_type": "a list like (a b c)",
    "dict_type": "a plist like (:key value ...)", "model_type": "a plist like (:key value ...)",
    "model_attributes_type": "a plist like (:key value ...)",
    "none_required": "nil",
}

_BOUNDS = {
    "string_too_short": ("at least", "min_length", "character"),
    "string_too_long": ("at most", "max_length", "character"),
    "too_short": ("at least", "min_length", "item"),
    "too_long": ("at most", "max_length", "item"),
}

_COMPARISONS = {"greater_than": ("greater than", "gt"),
                "greater_than_equal": ("at least", "ge"),
                "less_than": ("less than", "lt"),
                "less_than_equal": ("at most", "le"),
                "multiple_of": ("a multiple of", "multiple_of")}


def plain_reasons(error: ValidationError, *, unknown: str,
                  keyword_choices: bool = True) -> list[str]:
    """ERROR as plain sentences, at most MAX_REASONS of them and a count of the rest.

    UNKNOWN ends the sentence for a key that is not allowed ("is not a field of
    this action"); KEYWORD_CHOICES writes a choice among literals as ``:a or :b``
    (action fields) rather than ``"a" or "b"`` (tool arguments)."""
    sentences: list[str] = []
    problems = error.errors(include_url=False)
    for item in problems:
        sentence = clip(describe(item, unknown=unknown, keyword_choices=keyword_choices),
                        SENTENCE_LIMIT)
        if sentence not in sentences:
            sentences.append(sentence)
        if len(sentences) > MAX_REASONS:
            break
    if len(sentences) <= MAX_REASONS:
        return sentences
    return [*sentences[:MAX_REASONS],
            f"and {len(problems) - MAX_REASONS} more problems like these"]


def describe(item: dict[str, Any], *, unknown: str, keyword_choices: bool = True) -> str:
    """One pydantic error ITEM as a sentence."""
    where = place(item.get("loc", ()))
    kind = item.get("type", "")
    context = item.get("ctx") or {}
    if kind == "missing":
        return f"{where} is missing"
    if kind == "extra_forbidden":
        return f"{where} {unknown}"
    given = excerpt(item.get("input"), QUOTE_LIMIT)
    if kind in ("value_error", "assertion_error") and "error" in context:
        message = str(context["error"]).removeprefix("Assertion failed, ")
        return f"{where} {clip(message, 200)}"
    if kind == "literal_error":
        return f"{where} must be {_choices(context.get('expected', ''), keyword_choices)}, " \
               f"not {given}"
    return f"{where} {_expectation(kind, context, item.get('msg', ''))}, not {given}"


def place(loc: tuple[Any, ...] | list[Any]) -> str:
    """Where an error is: the plist key, then ``item N`` for list elements.
    Pydantic's own path parts (union and validator tags) are left out."""
    if not loc:
        return "the value"
    words = [":" + clip(str(loc[0]), 40).replace("_", "-")]
    words.extend(f"item {part + 1}" for part in loc[1:] if isinstance(part, int))
    return " ".join(words)


def _expectation(kind: str, context: dict[str, Any], message: str) -> str:
    """What a value of error KIND should have been, as the end of a sentence."""
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}"
    if kind in _BOUNDS:
        word, key, unit = _BOUNDS[kind]
        count = context.get(key)
        if kind == "string_too_short" and count == 1:
            return "must not be empty"
        return f"must have {word} {count} {unit}{'' if count == 1 else 's'}"
    if kind in _COMPARISONS:
        word, key = _COMPARISONS[kind]
        return f"must be {word} {context.get(key)}"
    return _reworded(message)


def _reworded(message: str) -> str:
    """A pydantic message for an error kind not listed above, in plainer words."""
    text = message.removeprefix("Value error, ").split(",")[0]
    for prefix, plain in (("Input should be a valid ", "must be a valid "),
                          ("Input should be ", "must be ")):
        if text.startswith(prefix):
            return plain + text[len(prefix):]
    return "is not valid here"


def _choices(expected: str, keyword_choices: bool) -> str:
    """Pydantic's "'a' or 'b'" as ":a or :b" (keywords) or '"a" or "b"'."""
    quote: Callable[[re.Match[str]], str] = (
        (lambda m: ":" + m.group(1)) if keyword_choices else (lambda m: f'"{m.group(1)}"'))
    return "one of " + _QUOTED.sub(quote, expected) if " or " in expected \
        else _QUOTED.sub(quote, expected)

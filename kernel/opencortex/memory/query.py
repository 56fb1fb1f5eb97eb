"""User text as a safe FTS5 query: its words, quoted, without punctuation or "'s".

Quoting makes every FTS5 operator and special character plain text, so no
syntax error can arise; the tokenizer then splits and stems each phrase (and
irregular verbs bring their other forms, see `verbforms`).
"""

from __future__ import annotations

import re

from opencortex.memory.verbforms import other_forms

MAX_QUERY_TERMS = 32
_POSSESSIVE = re.compile(r"(?<=\w)['\u2019][sS]?$")
_EDGES = re.compile(r"^\W+|\W+$")


def query_words(text: str) -> list[str]:
    """The words of TEXT without surrounding punctuation or a possessive "'s"
    ("Caroline's?" -> "Caroline"), first MAX_QUERY_TERMS, no repeats."""
    words = []
    for word in text.replace("\0", " ").split():
        word = _POSSESSIVE.sub("", _EDGES.sub("", word))
        if word:                      # punctuation alone matches nothing
            words.append(word)
    return list(dict.fromkeys(words))[:MAX_QUERY_TERMS]


def query_phrases(text: str, *, verb_forms: bool = False) -> list[str]:
    """The words of user text as quoted FTS5 phrases (see `query_words`); with
    VERB_FORMS (a tokenizer that stems English), each irregular verb's other forms
    too, after the words ("ran" -> "ran", ..., "run").

    Quoting makes every FTS5 operator and special character plain text, so no
    syntax error can arise.
    """
    words = query_words(text)
    if verb_forms:
        words = list(dict.fromkeys(words + [form for word in words
                                            for form in other_forms(word)]))
    return [fts_phrase(word) for word in words]


def fts_phrase(text: str) -> str:
    """TEXT as one quoted FTS5 phrase: every operator and special character in it is
    plain text (the tokenizer splits it into words)."""
    return '"' + text.replace('"', '""') + '"'


def match_query(text: str) -> str | None:
    """Turn user text into a safe FTS5 query: its words, each quoted, joined by OR.

    Returns None when the text holds no words.
    """
    return " OR ".join(query_phrases(text)) or None



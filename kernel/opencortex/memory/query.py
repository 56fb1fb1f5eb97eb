"""User text as a safe FTS5 query: its words, quoted, without punctuation or "'s".

Quoting makes every FTS5 operator and special character plain text, so no
syntax error can arise; the tokenizer then splits and stems each phrase (and
irregular verbs bring their other forms, see `verbforms`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from opencortex.memory.cjk import cjk_words
from opencortex.memory.verbforms import other_forms

MAX_QUERY_TERMS = 32
MAX_QUERY_CHARS = 4096      # of a longer text, its first and its last this many are read
_POSSESSIVE = re.compile(r"(?<=\w)['\u2019][sS]?$")
_EDGES = re.compile(r"^\W+|\W+$")


def query_text(text: str) -> str:
    """TEXT, or of a long one its start and its end (MAX_QUERY_CHARS each, cut between
    words): a pasted page followed by a question costs no more than a short message,
    and the question still counts."""
    if len(text) <= 2 * MAX_QUERY_CHARS:
        return text
    head = text[:MAX_QUERY_CHARS].rsplit(None, 1)[0]
    tail = text[-MAX_QUERY_CHARS:].split(None, 1)[-1]
    return f"{head} {tail}"


def bare_word(word: str) -> str:
    """WORD without surrounding punctuation or a possessive "'s" ("Caroline's?" ->
    "Caroline", "where's" -> "where"); "" for punctuation alone."""
    return _POSSESSIVE.sub("", _EDGES.sub("", word))


def query_words(text: str) -> list[str]:
    """The words of TEXT (see `query_text`) without surrounding punctuation or a
    possessive "'s" ("Caroline's?" -> "Caroline"), Chinese and Japanese as pairs of
    characters (see `cjk`), no repeats; of more than
    MAX_QUERY_TERMS, the first and the last half of them (a question often ends a
    long message)."""
    words = []
    for spaced in query_text(text).replace("\0", " ").split():
        for word in cjk_words(bare_word(spaced)):     # "东京的" -> "东京", "京的"
            word = bare_word(word)
            if word:                  # punctuation alone matches nothing
                words.append(word)
    unique = list(dict.fromkeys(words))
    if len(unique) <= MAX_QUERY_TERMS:
        return unique
    half = MAX_QUERY_TERMS // 2
    return unique[:half] + unique[-half:]


def query_phrases(text: str, *, verb_forms: bool = False,
                  stem: Callable[[list[str]], list[str]] | None = None) -> list[str]:
    """The words of user text as quoted FTS5 phrases (see `query_words`); with
    VERB_FORMS (a tokenizer that stems English), each irregular verb's other forms
    too, after the words ("ran" -> "ran", ..., "run"); with STEM, the terms STEM
    makes of those words (a Snowball stemmer's: see `stems`).

    Quoting makes every FTS5 operator and special character plain text, so no
    syntax error can arise.
    """
    words = query_words(text)
    if verb_forms:
        words = list(dict.fromkeys(words + [form for word in words
                                            for form in other_forms(word)]))
    if stem is not None:
        words = stem(words)
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



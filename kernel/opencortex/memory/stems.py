"""Snowball stemming (PyStemmer) for archives in languages FTS5's porter does not stem.

FTS5 stems English only (its porter tokenizer), and Python's sqlite3 cannot give
it a tokenizer of its own.  So with `[memory] stemmer = "german"` (any Snowball
language) the index's tables split words as written (unicode61) and the stems
are made here: each message's words' stems, where they differ from the word,
are kept in the column beside its text (with the Chinese and Japanese terms,
see `cjk`), and a question's words are searched as their stems.  "Häuser" is
then found by "Haus", "книги" by "книга"; the text itself stays as written, so
snippets show it as said.

PyStemmer is an optional part (`bash kernel/install.sh stemming`); it is only
imported when a Snowball stemmer is configured.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable

from opencortex.memory.cjk import cjk_terms

PREFIX = "snowball-"          # the index's tokenizer name for a Snowball language
INSTALL_HINT = "bash kernel/install.sh stemming (the PyStemmer package)"
_WORD = re.compile(r"[^\W_]+")  # a word as FTS5's unicode61 splits text (letters, digits)
_stemmers = threading.local()   # each thread's PyStemmer objects, by language


def snowball_languages() -> list[str]:
    """The Snowball languages PyStemmer offers ("porter" aside: FTS5 has its own);
    ImportError saying how to install it when it is missing."""
    try:
        import Stemmer
    except ImportError:
        raise ImportError(f"Snowball stemmers need PyStemmer: {INSTALL_HINT}") from None
    return sorted(set(Stemmer.algorithms()) - {"porter"})


def language_of(tokenizer: str) -> str | None:
    """The Snowball language of the index tokenizer name TOKENIZER, or None."""
    return tokenizer[len(PREFIX):] if tokenizer.startswith(PREFIX) else None


def word_stemmer(language: str) -> Callable[[str], str]:
    """A function stemming one lower-case word in LANGUAGE (a Snowball language), with a
    PyStemmer object of the calling thread's (one is not safe to share: the writer
    thread stems messages while the reading threads stem questions)."""
    import Stemmer

    def stem(word: str) -> str:
        """WORD's stem."""
        stemmers = _stemmers.__dict__.setdefault("by_language", {})
        stemmer = stemmers.get(language)
        if stemmer is None:
            stemmer = stemmers[language] = Stemmer.Stemmer(language)
        return stemmer.stemWord(word)
    return stem


def folded(text: str) -> str:
    """TEXT as the Snowball stemmers take it: lower case, accents composed (NFC)."""
    text = text.casefold()
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def stems_of(text: str, stem: Callable[[str], str]) -> list[str]:
    """The stems of TEXT's words that differ from the word, each once, in order."""
    stems = []
    for word in dict.fromkeys(_WORD.findall(folded(text))):
        root = stem(word)
        if root != word:
            stems.append(root)
    return list(dict.fromkeys(stems))


def terms_function(tokenizer: str) -> Callable[[str], str]:
    """The terms the index keeps beside a message's text, for the tables of TOKENIZER:
    its Chinese and Japanese terms (see `cjk`), and with a Snowball stemmer its
    words' stems."""
    language = language_of(tokenizer)
    if language is None:
        return cjk_terms
    stem = word_stemmer(language)

    def terms(text: str) -> str:
        """TEXT's Chinese and Japanese terms and its words' stems, spaced."""
        return " ".join(filter(None, (cjk_terms(text), " ".join(stems_of(text, stem)))))
    return terms


def query_stemmer(tokenizer: str) -> Callable[[list[str]], list[str]] | None:
    """For the tables of TOKENIZER, what makes a question's words the terms searched, or
    None: the words are searched as written (FTS5 stems them, or nothing does)."""
    language = language_of(tokenizer)
    if language is None:
        return None
    stem = word_stemmer(language)

    def searched(words: list[str]) -> list[str]:
        """The stems of WORDS, each part of a word on its own ("Häuser-Verkauf" -> "haus",
        "verkauf"), each once."""
        return list(dict.fromkeys(stem(part) for word in words
                                  for part in _WORD.findall(folded(word))))
    return searched

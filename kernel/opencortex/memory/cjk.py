"""Chinese and Japanese text as searchable terms (single characters and pairs), and
full-width forms as NFKC spells them.

Written without spaces, a run of Chinese characters or kana is one "word"
to FTS5's unicode61 tokenizer, so "东京" never matched "我住在东京".  As
search engines do for these scripts, the index keeps each run's characters
and overlapping pairs of them as terms of their own (in a column beside the
text, which stays as written for snippets), and a question's runs become
the same pairs (a character standing alone: itself).  Pairs are rarer than
characters, so ranking puts a message holding the question's pairs first.
"""

from __future__ import annotations

import re
import unicodedata

# Hiragana, katakana, CJK ideographs (extension A, unified, compatibility), half-width
# katakana.  Hangul is written with spaces between words: the tokenizer splits it.
_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+")


def cjk_terms(text: str) -> str:
    """The terms the index keeps for TEXT beside its words, separated by spaces: for its
    Chinese and Japanese runs each character and each pair of neighbours, and the
    words written in full-width or other compatibility forms as NFKC spells them
    ("ＡＢＣ" -> "ABC"); "" when it has none (any ASCII text)."""
    if text.isascii():
        return ""
    normal = unicodedata.normalize("NFKC", text)
    terms = [word for word in normal.split() if word not in text] if normal != text else []
    for run in _RUN.findall(normal):
        terms.extend(run)
        terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return " ".join(terms)


def cjk_words(word: str) -> list[str]:
    """WORD (in NFKC form) as query words: its Chinese and Japanese runs as pairs of
    neighbouring characters (a run of one: that character), the rest of it as it was."""
    if word.isascii():
        return [word]
    word = unicodedata.normalize("NFKC", word)
    if not _RUN.search(word):
        return [word]
    words: list[str] = []
    for part in re.split(f"({_RUN.pattern})", word):
        if not part:
            continue
        if _RUN.fullmatch(part):
            words.extend([part] if len(part) == 1 else
                         [part[i:i + 2] for i in range(len(part) - 1)])
        elif part.strip():
            words.append(part)
    return words

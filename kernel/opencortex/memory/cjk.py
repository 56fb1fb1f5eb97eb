"""Chinese and Japanese text as searchable terms: single characters and pairs.

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

# Hiragana, katakana, CJK ideographs (extension A, unified, compatibility), half-width
# katakana.  Hangul is written with spaces between words: the tokenizer splits it.
_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+")


def cjk_terms(text: str) -> str:
    """The terms the index keeps for the Chinese and Japanese runs of TEXT, separated
    by spaces: each character and each pair of neighbours ("" when it has none)."""
    terms: list[str] = []
    for run in _RUN.findall(text):
        terms.extend(run)
        terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return " ".join(terms)


def cjk_words(word: str) -> list[str]:
    """WORD as query words: its Chinese and Japanese runs as pairs of neighbouring
    characters (a run of one: that character), the rest of it as it was."""
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

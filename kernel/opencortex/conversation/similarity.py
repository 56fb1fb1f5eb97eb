"""Semantic distance between two texts, used to measure what a compression lost.

A `Similarity` has a `name` (reported next to the loss, so the user knows how
it was measured) and `distance(a, b)` in [0, 1]: 0 for the same meaning, 1 for
nothing in common.  `LexicalSimilarity` is offline and dependency-free;
`EmbeddingSimilarity` loads a sentence-transformers model on first use and is
only used when configured (``similarity = "embedding:<model>"``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Protocol, runtime_checkable

# Frequent function words that say nothing about what a text is about.
STOPWORDS = frozenset(
    """
    a an the and or but if then else so of to in on at by for with from into onto about as
    is are was were be been being am do does did done have has had having it its it's this
    that these those there here i me my we us our you your he him his she her they them
    their what which who whom whose when where why how not no yes can could would should
    will shall may might must just also too very really quite than more most some any
    all each every both either neither one ok okay up out over under again only own same
    such s t d ll re ve m
    """.split()
)
_WORD = re.compile(r"[\w][\w'.:/+-]*[\w]|[\w]", re.UNICODE)


def content_words(text: str) -> list[str]:
    """TEXT's words that carry content, lower-cased: stopwords dropped, numbers and code kept.
    Read a line at a time (no word spans lines): one search over a whole long context
    held Python's lock for tens of ms, and with it every other thread, the loop's too."""
    words = (w.lower().strip("'.") for line in text.split("\n") for w in _WORD.findall(line))
    return [w for w in words if w and w not in STOPWORDS]


@runtime_checkable
class Similarity(Protocol):
    """A measure of how far apart two texts are in meaning."""

    name: str

    def distance(self, a: str, b: str) -> float:
        """0 for the same meaning, 1 for nothing in common."""
        ...


class LexicalSimilarity:
    """1 - cosine of the content-word count vectors of the two texts (offline, exact, cheap).

    Counts are damped (1 + log n) so a word repeated many times does not
    outweigh the rest.  Two texts without content words are identical (0); one
    without content words is as far as can be from one with (1).
    """

    name = "lexical"

    def distance(self, a: str, b: str) -> float:
        va, vb = _weights(a), _weights(b)
        if not va and not vb:
            return 0.0
        if not va or not vb:
            return 1.0
        dot = sum(va[t] * vb[t] for t in sorted(va.keys() & vb.keys()))  # symmetric, exactly
        norm = _length(va.values()) * _length(vb.values())
        return min(1.0, max(0.0, 1.0 - dot / norm))


def _length(values) -> float:
    """The Euclidean length of a vector given as its components."""
    return math.sqrt(sum(v * v for v in values))


def _weights(text: str) -> dict[str, float]:
    return {term: 1.0 + math.log(n) for term, n in Counter(content_words(text)).items()}


class EmbeddingSimilarity:
    """1 - cosine of sentence embeddings (sentence-transformers, imported on first use).

    Nothing is downloaded or imported until `distance` is first called; if the
    package is missing, that call raises a RuntimeError saying how to install it.
    """

    def __init__(self, model: str = "all-MiniLM-L6-v2"):
        if not model or not model.strip():
            raise ValueError("an embedding model name is required, e.g. 'all-MiniLM-L6-v2'")
        self.model_name = model.strip()
        self.name = f"embedding:{self.model_name}"
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            try:
                # optional and heavy: imported only when this measure is used
                from sentence_transformers import SentenceTransformer  # noqa: PLC0415
            except ImportError as error:
                raise RuntimeError(
                    f"similarity {self.name!r} needs the sentence-transformers package; "
                    "install it (pip install sentence-transformers) or use the 'lexical' "
                    "measure") from error
            self._model = SentenceTransformer(self.model_name)
        return self._model

    def distance(self, a: str, b: str) -> float:
        if not a.strip() and not b.strip():
            return 0.0
        if not a.strip() or not b.strip():
            return 1.0
        first, second = self._load().encode([a, b])
        dot = float(sum(float(x) * float(y) for x, y in zip(first, second)))
        norm = _length(float(x) for x in first) * _length(float(y) for y in second)
        if norm == 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - dot / norm))


def similarity_from_name(name: str) -> Similarity:
    """The measure called NAME: "lexical" or "embedding:<model>" (ValueError otherwise)."""
    if name == "lexical":
        return LexicalSimilarity()
    if name.startswith("embedding:"):
        return EmbeddingSimilarity(name.removeprefix("embedding:"))
    raise ValueError(f"unknown similarity {name!r}; use 'lexical' or 'embedding:<model>' "
                     "(e.g. 'embedding:all-MiniLM-L6-v2')")

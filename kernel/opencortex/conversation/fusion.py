"""Reciprocal rank fusion of recall's lexical and dense rankings.

Each list votes 1 / (k + rank) for each of its hits (rank 1 is the best; the
dense list's vote is multiplied by its weight) and hits are ordered by the sum
(Cormack, Clarke and Büttcher, SIGIR 2009).  Ranks, not scores, are fused: a
BM25 score and a cosine are not on one scale.  A tie keeps the lexical order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opencortex.memory import SearchHit

DEFAULT_K = 60


@dataclass(frozen=True)
class Ranked:
    """A fused hit, and why it is where it is."""

    hit: SearchHit              # as its first list found it (its score is that list's)
    lexical: int | None         # rank in the lexical list (1 = best), None: not in it
    dense: int | None           # rank in the dense list
    fused: float | None         # the fused score (higher is better); None: lexical only


def fuse(lexical: Sequence[SearchHit], dense: Sequence[SearchHit], *,
         k: int = DEFAULT_K, weight: float = 1.0) -> list[Ranked]:
    """LEXICAL and DENSE (each best first) fused into one list, best first."""
    if k < 1 or weight <= 0:
        raise ValueError(f"fusion needs k >= 1 and weight > 0, not k={k}, weight={weight}")
    found: dict[str, list] = {}          # id -> [hit, lexical rank, dense rank, first seen]
    for which, hits in ((1, lexical), (2, dense)):
        for rank, hit in enumerate(hits, 1):
            entry = found.setdefault(hit.id, [hit, None, None, len(found)])
            if entry[which] is None:
                entry[which] = rank
    ranked = [Ranked(hit, lex, den, _vote(lex, k, 1.0) + _vote(den, k, weight))
              for hit, lex, den, _ in found.values()]
    order = {id(r): found[r.hit.id][3] for r in ranked}
    return sorted(ranked, key=lambda r: (-r.fused, order[id(r)]))


def _vote(rank: int | None, k: int, weight: float) -> float:
    """A list's vote for the hit at RANK (none when it is not in the list)."""
    return 0.0 if rank is None else weight / (k + rank)
